"""W&B reporting: with WANDB_MODE=offline and no API key, the steps land in a run on disk, read back record by record.

The `.wandb` file is W&B's transaction log (LevelDB's log format holding `wandb_internal_pb2.Record`s); wandb has no
reader of its own any more, so `read_run` below is one. Each test tears W&B down after itself: its settings and
service process are global to the process.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import wandb
from wandb.proto import wandb_internal_pb2

import art_agents as art
from art_agents.errors import ArtError
from art_agents.integrations.wandb_metrics import STEP_METRIC, WandbReporter
from art_agents.local import LocalBackend
from art_agents.report.reporters import StepRecord, create_reporters, reporter_names
from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG, rollout_groups

BLOCK, HEADER = 32768, 7  # LevelDB log: 32 KiB blocks, 7-byte record headers (crc32, length, type)
FULL, LAST = 1, 4


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Offline W&B writing under tmp_path, with no key anywhere it looks (env, netrc, settings) and a fresh setup."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_SERVICE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    wandb.teardown()
    yield tmp_path
    wandb.teardown()


def read_run(wandb_dir: Path) -> tuple[Any, list[dict[str, Any]]]:
    """The run record and the history rows of the one offline run under `wandb_dir`.

    W&B's service may still be writing the file when `run.finish()` returns (seen: a file without its run record),
    so the service is stopped first, as at the end of the process.
    """
    wandb.teardown()
    (path,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    run, rows, position, chunks = None, [], HEADER, b""  # the file header is 7 bytes too
    while position + HEADER <= len(data):
        if BLOCK - position % BLOCK < HEADER:  # a block's tail too short for a header is padding
            position += BLOCK - position % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + HEADER])
        if kind == 0:
            break
        chunks += data[position + HEADER : position + HEADER + length]
        position += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record.FromString(chunks)
            chunks = b""
            if record.HasField("run"):
                run = record.run
            if record.HasField("history"):
                rows.append(history_row(record.history))
    return run, rows


def history_row(history: Any) -> dict[str, Any]:
    """`{key: value}`; a media value (a histogram) comes as one item per field, under `nested_key`, and is rebuilt."""
    row: dict[str, Any] = {}
    for item in history.item:
        value = json.loads(item.value_json)
        name, *field = [item.key] if item.key else item.nested_key
        if field:
            row.setdefault(name, {})[field[0]] = value
        else:
            row[name] = value
    return row


def metric_rows(rows: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """Rows holding `prefix*` metrics, without W&B's own `_` keys."""
    return [
        {key: value for key, value in row.items() if not key.startswith("_")}
        for row in rows
        if any(key.startswith(prefix) for key in row)
    ]


def group(*rewards: float) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(
        art.Trajectory(
            messages_and_choices=[{"role": "user", "content": "Say a."}, {"role": "assistant", "content": "a" * n}],
            reward=reward,
        )
        for n, reward in enumerate(rewards, start=1)
    )


def test_offline_run_holds_each_step_at_its_training_step(offline_wandb: Path) -> None:
    model = art.TrainableModel(name="agent-7", project="wb", base_model="tiny/base", config=TOY_MODEL_CONFIG)
    reporter = WandbReporter(model)
    groups = [group(0.0, 1.0), group(0.5, 0.5)]
    train = {"reward_mean": 0.5, "loss": 0.25, "grad_norm": 1.5, "tokens_trained": 40.0, "train_s": 0.5}
    reporter.record(StepRecord("train", 1, groups, {**train, "step": 1.0}, 100.0, 102.5))
    reporter.record(StepRecord("train", 2, groups, {**train, "loss": 0.125, "step": 2.0}, 103.0, 104.0))
    # an evaluation of an older checkpoint, after step 2: a plain wandb.log(step=1) would be dropped
    reporter.record(StepRecord("val", 1, [group(0.0, 1.0)], {"val/reward": 0.5, "val/n": 2.0}, 105.0, 105.1))
    reporter.close()

    run, rows = read_run(offline_wandb)
    assert (run.run_id, run.project, run.display_name) == ("agent-7", "wb", "agent-7")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["base_model"] == "tiny/base" and config["lora_rank"] == TOY_MODEL_CONFIG.lora_rank

    train_rows = metric_rows(rows, "train/")
    steps = [(r[STEP_METRIC], r["train/loss"], r["train/step_wall_s"]) for r in train_rows]
    assert steps == [(1, 0.25, 2.5), (2, 0.125, 1.0)]
    assert all(r["train/reward_mean"] == 0.5 and r["train/tokens_trained"] == 40 for r in train_rows)
    assert "train/step" not in train_rows[0]  # the step is the x-axis, not a chart
    histogram = train_rows[0]["train/reward_distribution"]
    assert histogram["_type"] == "histogram" and sum(histogram["values"]) == 4  # the four rewards
    (val,) = metric_rows(rows, "val/")
    assert (val[STEP_METRIC], val["val/reward"], val["val/n"]) == (1, 0.5, 2)
    assert sum(val["val/reward_distribution"]["values"]) == 2


def test_report_to_wandb_builds_the_reporter_without_starting_a_run(
    offline_wandb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def model(**options: Any) -> art.TrainableModel:
        return art.TrainableModel(name="m", project="p", base_model="tiny/base", **options)

    for built in (model(report_to=["wandb"]), model(report_metrics=["wandb"])):  # ART's name for it too
        (reporter,) = create_reporters(reporter_names(built.report_to), built)
        assert isinstance(reporter, WandbReporter)
    monkeypatch.setenv("ART_AGENTS_REPORT_TO", "wandb")
    assert reporter_names(model().report_to) == ["wandb"]
    reporter.close()  # nothing was recorded: no run, no folder
    assert not (offline_wandb / "wandb").exists()


def test_online_without_a_key_fails_at_registration_instead_of_prompting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "online")
    model = art.TrainableModel(name="m", project="p", base_model="tiny/base", report_to=["wandb"])
    with pytest.raises(ArtError, match=r"wandb login.*WANDB_MODE=offline"):
        create_reporters(reporter_names(model.report_to), model)


def test_a_run_that_did_not_start_is_not_retried_at_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def unreachable(**options: Any) -> None:
        calls.append(options)
        raise TimeoutError("no answer from W&B in 90 s")

    monkeypatch.setattr(wandb, "init", unreachable)
    reporter = WandbReporter(art.TrainableModel(name="m", project="p", base_model="tiny/base"))
    step = StepRecord("train", 1, [], {"loss": 1.0}, 0.0, 1.0)
    with pytest.raises(TimeoutError):
        reporter.record(step)
    with pytest.raises(ArtError, match=r"did not start.*no answer"):
        reporter.record(step)
    assert len(calls) == 1


async def test_training_through_the_server_reports_its_steps(offline_wandb: Path, tiny_model_path: Path) -> None:
    backend = LocalBackend(path=offline_wandb / ".art", in_process=True)
    model = art.TrainableModel(
        name="e2e", project="wb", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG, report_to=["wandb"]
    )
    await model.register(backend)
    client = model.openai_client()
    try:
        result = await model.train(await rollout_groups(client, model, 0, rollouts=2), progress=False)
        logged = await model.log([group(0.25, 0.75)], split="val")
    finally:
        await client.close()
        await backend.close()  # finishes the run

    _, rows = read_run(offline_wandb)
    (train,) = metric_rows(rows, "train/")
    assert train[STEP_METRIC] == result.step
    assert {f"train/{name}": value for name, value in result.metrics.items() if name != "step"}.items() <= train.items()
    (val,) = metric_rows(rows, "val/")
    assert (val[STEP_METRIC], val["val/reward"]) == (logged.step, 0.5)

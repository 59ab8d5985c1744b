"""The pipelined loop against the real server and the tiny model: its figures reach history.jsonl, and a
run interrupted at any point (the loop cancelled, the process killed with -9) resumes from the last
checkpoint with no rollout trained twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from server_fixtures import ROLLOUT_MODULE, start_server

from art_agents import TrainableModel
from art_agents.backends.remote import RemoteBackend
from art_agents.jsonl import read_groups
from art_agents.loop.train import train_loop
from art_agents.train_config import ModelConfig, TrainConfig

MODEL_CONFIG = ModelConfig(lora_rank=4, max_batch_size=16, default_max_tokens=6)
SCENARIOS = [
    {"prompt": "Say aaaa!", "letter": "a"},
    {"prompt": "Write b.", "letter": "b"},
    {"prompt": "e?", "letter": "e"},
]


def history(model_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines() if line.strip()]


def trained_completion_ids(model_dir: Path) -> list[str]:
    """Every completion id in every trained step's trajectories (a rollout trained twice shows up twice)."""
    return [
        turn.completion_id
        for path in sorted((model_dir / "trajectories" / "train").glob("*.jsonl"))
        for group in read_groups(path)
        for trajectory in group.trajectories
        for turn in trajectory.turns
    ]


def assert_resumed_cleanly(model_dir: Path) -> list[dict]:
    rows = history(model_dir)
    assert [row["step"] for row in rows] == list(range(1, len(rows) + 1))
    ids = trained_completion_ids(model_dir)
    assert ids and len(ids) == len(set(ids)), "a rollout was trained twice"
    return rows


async def test_pipelined_steps_record_their_figures_and_resume_after_a_cancel(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    namespace: dict = {}
    exec(ROLLOUT_MODULE, namespace)
    attempt = namespace["attempt"]
    art_path = tmp_path / "art"
    with start_server(art_path) as url:
        backend = RemoteBackend(url)
        model = TrainableModel(name="piped", project="p", base_model=str(tiny_model_path), config=MODEL_CONFIG)
        await model.register(backend)
        options = dict(groups_per_step=2, rollouts_per_group=4, pipeline=True, max_steps_off_policy=1)
        config = TrainConfig(learning_rate=1e-3)

        first_step_done = asyncio.Event()

        async def after_train(record, groups) -> None:
            first_step_done.set()

        run = asyncio.create_task(
            train_loop(model, attempt, SCENARIOS, steps=4, train_config=config, after_train=after_train, **options)
        )
        await first_step_done.wait()
        await asyncio.sleep(0.3)  # the next draws are rolling out, or the next step is training
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        reached = await model.get_step()
        assert 1 <= reached < 4

        records = await train_loop(model, attempt, SCENARIOS, steps=2, train_config=config, **options)
        assert records[-1].step >= reached + 2
        await backend.close()

    rows = assert_resumed_cleanly(art_path / "p" / "models" / "piped")
    for row in rows:
        assert row["config"]["tis_cap"] == 3.0 and row["config"]["max_staleness"] == 1
        assert row["metrics"]["pipeline/staleness"] <= 1
        assert {"pipeline/trainer_wait_s", "pipeline/rollout_wait_s", "pipeline/rollouts_per_s"} <= set(row["metrics"])
        assert not any(k.startswith("turns_staleness_") and int(k.rsplit("_", 1)[1]) > 1 for k in row["metrics"])


@pytest.mark.slow
def test_kill_9_of_a_pipelined_job_then_rerun(tiny_model_path: Path, tmp_path: Path) -> None:
    """`art-agents train` killed with -9 while it rolls out and trains; the same command then finishes the job."""
    (tmp_path / "agent.py").write_text(ROLLOUT_MODULE)
    (tmp_path / "scenarios.jsonl").write_text("\n".join(json.dumps(s) for s in SCENARIOS) + "\n")
    (tmp_path / "job.toml").write_text(
        f'name = "k9"\nproject = "p"\nbase_model = "{tiny_model_path}"\nrollout = "agent:attempt"\n'
        'scenarios = "scenarios.jsonl"\nart_path = "art"\nsteps = 3\ngroups_per_step = 2\nrollouts_per_group = 4\n'
        "pipeline = true\nmax_steps_off_policy = 1\n"
        "[model]\nlora_rank = 4\nmax_batch_size = 16\ndefault_max_tokens = 6\n[train]\nlearning_rate = 1e-3\n"
    )
    model_dir = tmp_path / "art" / "p" / "models" / "k9"
    command = [sys.executable, "-m", "art_agents", "train", str(tmp_path / "job.toml")]
    job = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while not ((model_dir / "history.jsonl").exists() and history(model_dir)):
        assert job.poll() is None, job.stdout.read().decode()[-3000:] if job.stdout else ""
        assert time.monotonic() < deadline, "no step trained in time"
        time.sleep(0.05)
    time.sleep(0.4)  # into the next draws or the next step
    os.kill(job.pid, signal.SIGKILL)
    job.wait(timeout=30)
    killed_at = len(history(model_dir))

    rerun = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    rows = assert_resumed_cleanly(model_dir)
    assert len(rows) >= killed_at + 3

"""An ART program after renaming `art` to `art_agents`: LocalBackend(path, in_process), the model's ART methods,
`model.log` + `delete_checkpoints(best_checkpoint_metric=...)`, ART's training keywords, `iterate_dataset`, gather."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

import art_agents as art
from art_agents.local import LocalBackend
from art_agents.server.ops.quickstart import TOY_CONFIG, TOY_MODEL_CONFIG, rollout_groups
from art_agents.utils import DatasetBatch, iterate_dataset


class Scenario(BaseModel):
    """ART programs keep their own settings in `config`."""

    max_turns: int = 3


@pytest.fixture(scope="module")
def art_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("art-compat") / ".art"


@pytest.fixture(scope="module")
async def backend(art_path: Path) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(path=str(art_path), in_process=True)
    yield backend
    await backend.close()


@pytest.fixture(scope="module")
async def model(backend: LocalBackend, tiny_model_path: Path) -> art.TrainableModel:
    model = art.TrainableModel(
        name="compat", project="art", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG, entity="team"
    )
    await model.register(backend)
    return model


async def train_one_step(model: art.TrainableModel, **train_kwargs: object) -> art.TrainResult:
    """Toy rollouts, then one step; a round without reward spread is retried with new seeds."""
    client = model.openai_client()
    step = await model.get_step()
    try:
        for attempt in range(4):
            groups = await rollout_groups(client, model, step, rollouts=4, attempt=attempt)
            result = await model.train(groups, **train_kwargs)  # type: ignore[arg-type]
            if result.step > step:
                return result
    finally:
        await client.close()
    raise AssertionError("four rounds without reward spread")


def val_group(*rewards: float) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(
        art.Trajectory(
            messages_and_choices=[{"role": "user", "content": "2+2?"}], reward=r, metrics={"correct": r > 0.5}
        )
        for r in rewards
    )


async def test_in_process_backend_serves_the_model_under_its_inference_name(
    backend: LocalBackend, model: art.TrainableModel, art_path: Path
) -> None:
    assert backend.in_process and backend._process is None and backend.path == art_path.resolve()
    assert model.trainable and model.get_inference_name() == "compat"
    assert model.get_inference_name(step=0) == "compat@0"
    client = model.openai_client()
    reply = await client.chat.completions.create(
        model=model.get_inference_name(), messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    await client.close()
    assert reply.model.startswith("compat@")
    assert (art_path / "art" / "models" / "compat" / "model.json").exists()  # the folder LocalBackend(path=...) named


async def test_litellm_completion_params_reach_the_server(model: art.TrainableModel) -> None:
    import litellm

    params = model.litellm_completion_params()
    assert params["model"] == "openai/compat" and params["base_url"] == model.inference_base_url
    response = await litellm.acompletion(**params, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert response.model.startswith("compat@")  # type: ignore[union-attr]
    pinned = model.litellm_completion_params(step=0)
    assert pinned["model"] == "openai/compat@0"


async def test_log_then_delete_checkpoints_keeps_exactly_the_latest_and_the_best(
    model: art.TrainableModel, art_path: Path
) -> None:
    model_dir = art_path / "art" / "models" / "compat"
    first = await model.get_step()
    with pytest.raises(art.ServerError, match=r"no checkpoint .* has a 'val/reward' value.*model\.log\(groups"):
        await model.delete_checkpoints(best_checkpoint_metric="val/reward")  # nothing logged yet: nothing deleted

    rewards = {}
    for val in (0.2, 0.9, 0.5):  # the middle step is the best
        step = await model.get_step()
        logged = await model.log([val_group(val, val)], split="val")
        assert logged.step == step and logged.metrics["val/reward"] == pytest.approx(val)
        rewards[step] = val
        if val != 0.5:
            await train_one_step(model, config=TOY_CONFIG, _config={"epsilon": 0.2}, verbose=True, progress=False)
    latest = await model.get_step()
    assert latest == first + 2
    best = max(rewards, key=rewards.__getitem__)

    row = json.loads((model_dir / "history.jsonl").read_text().splitlines()[-1])
    assert row["step"] == latest and row["split"] == "val"
    assert row["metrics"]["val/n"] == 2 and row["metrics"]["val/correct"] == 0.0
    assert len(art.read_groups(model_dir / "trajectories" / "val" / f"{latest:04d}.jsonl")) == 1

    deleted = await model.delete_checkpoints("val/reward")  # ART passes the metric positionally
    kept = [c.step for c in await model.backend.list_checkpoints(model)]
    assert kept == sorted({best, latest}) and best not in deleted and latest not in deleted

    # ours, without arguments: the latest and any best val step stay
    await train_one_step(model, config=TOY_CONFIG, progress=False)
    assert await model.delete_checkpoints() == [latest]
    assert [c.step for c in await model.backend.list_checkpoints(model)] == [best, latest + 1]

    from art_agents.report.command import report

    report(art_path=art_path, model="compat")  # val rows sit beside the train rows in the report


async def test_log_takes_trajectories_and_exceptions_and_extra_metrics(model: art.TrainableModel) -> None:
    good = val_group(1.0).trajectories[0]
    logged = await model.log([good, ValueError("boom")], split="test", metrics={"judge_cost": 0.5})
    assert logged.metrics["test/exception_rate"] == 0.5 and logged.metrics["test/judge_cost"] == 0.5
    with pytest.raises(art.ServerError, match="split"):
        await model.log([val_group(1.0)], split="../escape")
    with pytest.raises(art.ArtError, match="prompted Model"):
        await art.Model(name="baseline", project="art").log([val_group(1.0)])


def test_art_keywords_are_accepted_or_refused_by_name(tiny_model_path: Path) -> None:
    base = {"name": "m", "project": "p", "base_model": str(tiny_model_path)}
    model = art.TrainableModel(
        **base,
        config=Scenario(max_turns=5),
        trainable=True,
        run_name="m-run",
        _internal_config={"peft_args": {"r": 4, "lora_alpha": 8}, "engine_args": {"gpu_memory_utilization": 0.5}},
    )
    assert model.config.max_turns == 5  # type: ignore[union-attr]
    assert (model.server_config.lora_rank, model.server_config.lora_alpha) == (4, 8)
    assert model.server_config.gpu_memory_utilization == 0.5
    engine = {"tensor_parallel_size": 2, "enable_prefix_caching": False, "enforce_eager": True}
    shared = {"engine_args": engine, "trainer_gpu_ids": [0], "inference_gpu_ids": [0]}
    served = art.TrainableModel(**base, _internal_config=shared).server_config
    assert (served.tensor_parallel_size, served.prefix_cache_mb) == (2, 0.0)
    dedicated = {"trainer_gpu_ids": [2, 3], "inference_gpu_ids": [0, 1], "engine_args": {"tensor_parallel_size": 2}}
    served = art.TrainableModel(**base, _internal_config=dedicated).server_config
    assert (served.trainer_processes, served.trainer_devices) == (2, ["cuda:2", "cuda:3"])
    external = {
        "vllm_runtime": {"mode": "external", "server_url": "http://gpu-box:8000/v1"},
        "trainer_gpu_ids": [1],
        "rollout_weight_update_mode": "step_lora",
        "engine_args": {"num_scheduler_steps": 1},  # ART's 2048 example still sets it
    }
    served = art.TrainableModel(**base, _internal_config=external).server_config
    assert (served.engine, served.vllm_server_url, served.trainer_devices) == (
        "vllm",
        "http://gpu-box:8000/v1",
        ["cuda:1"],
    )
    assert art.TrainableModel(**base, lora_config={"rank": 2}).config.lora_rank == 2  # type: ignore[union-attr]
    assert art.TrainableModel(**base, report_metrics=["wandb"]).report_to == ["wandb"]
    for bad, named in [
        ({"report_metrics": ["wandb"], "report_to": ["langfuse"]}, "report_metrics"),
        ({"lora_config": {"use_rslora": True}}, "lora_config.use_rslora"),
        ({"_internal_config": {"init_args": {"load_in_4bit": True}}}, "load_in_4bit"),
        ({"_internal_config": {"engine_args": {"quantization": "fp8"}}}, "engine_args.quantization='fp8'"),
        ({"_internal_config": {"trainer_gpu_ids": [0], "inference_gpu_ids": [1]}}, r"first .* = 1 GPUs, \[0\]"),
        ({"_internal_config": {"trainer_gpu_ids": [0, 1], "inference_gpu_ids": [0]}}, "sharing GPUs \[0\]"),
        ({"_internal_config": {"trainer_gpu_ids": [1]}}, "one without the other"),
        ({"trainable": False}, "trainable must be True"),
        (
            {"_internal_config": {"rollout_weight_update_mode": "in_flight_lora"}},
            "in_flight_lora' \\(only 'step_lora'\\)",
        ),
        ({"_internal_config": {"vllm_runtime": {"mode": "external"}}}, "'external' with a server_url"),
    ]:
        with pytest.raises(ValidationError, match=named):
            art.TrainableModel(**base, **bad)  # type: ignore[arg-type]

    from art_agents.art.arguments import art_train_config

    config = art_train_config(
        art.TrainConfig(learning_rate=1e-4), {"kl_penalty_coef": 0.1, "normalize_by_length": False}
    )
    assert (config.learning_rate, config.beta, config.loss) == (1e-4, 0.1, "dr_grpo")
    assert art_train_config(None, {"precalculate_logprobs": True}, learning_rate=1e-5).learning_rate == 1e-5
    ppo = art_train_config(None, {"ppo": True, "epsilon": 0.1})
    assert (ppo.loss, ppo.epsilon, ppo.clip_high) == ("dapo", 0.1, 0.1)
    cispo = art_train_config(None, {"ppo": False, "epsilon_high": 2.0, "importance_sampling_level": "average"})
    assert (cispo.loss, cispo.clip_high, cispo.importance_sampling_level) == ("cispo", 3.0, "average")
    with pytest.raises(art.ArtError, match=r"advantage_balance=0\.5"):
        art_train_config(None, {"ppo": True, "advantage_balance": 0.5})
    for bad, named in [({"ppo": False, "epsilon": 0.2}, r"epsilon=0\.2 with ppo=False"), ({"ppo": "yes"}, "ppo='yes'")]:
        with pytest.raises(art.ArtError, match=named):
            art_train_config(None, bad)
    assert art_train_config(None, {"importance_sampling_level": "sequence"}).importance_sampling_level == "sequence"
    with pytest.raises(art.ArtError, match=r"importance_sampling_level='harmonic'"):
        art_train_config(None, {"importance_sampling_level": "harmonic"})


async def test_an_internal_config_set_after_construction_takes_effect_at_register(
    backend: LocalBackend, art_path: Path, tiny_model_path: Path
) -> None:
    """ART's 2048 example sets `model._internal_config = art.dev.InternalModelConfig(...)` after construction."""
    model = art.TrainableModel(name="late", project="art", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG)
    model._internal_config = art.dev.InternalModelConfig(
        init_args=art.dev.InitArgs(max_seq_length=8192, random_state=7),
        engine_args=art.dev.EngineArgs(enforce_eager=True),
        peft_args=art.dev.PeftArgs(r=4, lora_alpha=8),
    )
    await model.register(backend)
    stored = json.loads((art_path / "art" / "models" / "late" / "model.json").read_text())["config"]
    assert (stored["lora_rank"], stored["lora_alpha"], stored["seed"]) == (4, 8, 7)

    refused = art.TrainableModel(name="late4bit", project="art", base_model=str(tiny_model_path))
    refused._internal_config = art.dev.InternalModelConfig(init_args=art.dev.InitArgs(load_in_4bit=True))
    with pytest.raises(art.ArtError, match=r"_internal_config.init_args.load_in_4bit=True"):
        await refused.register(backend)
    assert not (art_path / "art" / "models" / "late4bit").exists()


def test_iterate_dataset_batches_epochs_and_resumes() -> None:
    data = list(range(10))
    random.seed(123)
    expected_draw = random.random()
    random.seed(123)
    batches = list(iterate_dataset(data, groups_per_step=4, num_epochs=2, use_tqdm=False))
    assert random.random() == expected_draw  # the caller's random state is untouched
    assert [(b.step, b.epoch, b.epoch_step, len(b.items)) for b in batches] == [
        (0, 0, 0, 4), (1, 0, 1, 4), (2, 0, 2, 2), (3, 1, 0, 4), (4, 1, 1, 4), (5, 1, 2, 2),
    ]  # fmt: skip
    for epoch in (0, 1):
        assert sorted(i for b in batches if b.epoch == epoch for i in b.items) == data
    order = list(range(10))
    random.Random(0).shuffle(order)  # ART: random.seed(epoch); random.shuffle(indices)
    assert batches[0].items == order[:4]
    resumed = list(iterate_dataset(data, groups_per_step=4, num_epochs=2, initial_step=4, use_tqdm=False))
    assert resumed == batches[4:] and isinstance(resumed[0], DatasetBatch)
    assert list(iterate_dataset([], 2, use_tqdm=False)) == []
    with pytest.raises(ValueError, match="groups_per_step"):
        next(iterate_dataset(data, groups_per_step=0))


async def test_gather_accepts_art_keywords() -> None:
    async def attempt(reward: float) -> art.Trajectory:
        await asyncio.sleep(0)
        return art.Trajectory(reward=reward, metrics={"turns": 1})

    async def split_in_two(group: art.TrajectoryGroup) -> list[art.TrajectoryGroup]:
        return [art.TrajectoryGroup(group.trajectories[:1]), art.TrajectoryGroup(group.trajectories[1:])]

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(attempt(r) for r in (0.0, 1.0))],
        pbar_desc="gather",
        pbar_total_completion_tokens=True,
        max_metrics=1,
        after_each=split_in_two,
    )
    assert [g.rewards() for g in groups] == [[0.0], [1.0]]
    results = await art.gather_trajectories(
        [attempt(1.0)], pbar_desc=None, pbar_total_completion_tokens=False, max_metrics=None
    )
    assert [r.reward for r in results] == [1.0]  # type: ignore[union-attr]


@pytest.mark.slow
async def test_the_child_process_backend_serves_the_same_routes(tiny_model_path: Path, tmp_path: Path) -> None:
    model = art.TrainableModel(name="child", project="art", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG)
    backend = LocalBackend(path=tmp_path / ".art", in_process=False)
    try:
        await model.register(backend)
        assert backend._process is not None and backend._thread is None
        logged = await model.log([val_group(0.5, 1.0)])
        assert logged.step == 0 and logged.metrics["val/reward"] == 0.75
        with pytest.raises(art.ServerError, match="'val/accuracy'"):
            await model.delete_checkpoints(best_checkpoint_metric="val/accuracy")
    finally:
        await backend.close()
    assert backend._process is None

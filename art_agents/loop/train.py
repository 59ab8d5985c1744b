"""The standard training loop: rollouts in groups, optional scoring, one train call per step.

`art-agents train CONFIG.toml` runs it from a file; AutoRL and MCP•RL drive the same loop.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from art_agents.evaluation.targets import ModelSpec
from art_agents.gather import AfterEach
from art_agents.loop.draws import (
    MAX_IDLE_DRAWS,
    AfterTrain,
    Draws,
    IdleDraws,
    RolloutFn,
    ScenarioSource,
    ShuffledCycle,
    StepRecord,
    scenario_source,
)
from art_agents.loop.pipeline import pipeline_loop
from art_agents.model import TrainableModel
from art_agents.schema import Schema
from art_agents.train_config import ModelConfig, TrainConfig
from art_agents.trajectory import TrajectoryGroup

__all__ = [
    "MAX_IDLE_DRAWS",
    "RolloutFn",
    "ScenarioSource",
    "ShuffledCycle",
    "StepRecord",
    "TrainJob",
    "load_function",
    "load_scenarios",
    "run_job",
    "train_loop",
]


async def train_loop(
    model: TrainableModel,
    rollout: RolloutFn,
    scenarios: Sequence[Any] | ScenarioSource,
    *,
    steps: int,
    groups_per_step: int = 4,
    rollouts_per_group: int = 4,
    train_config: TrainConfig | None = None,
    after_each: AfterEach | None = None,
    max_exceptions: int | float = 0.1,
    seed: int = 0,
    after_train: AfterTrain | None = None,
    pipeline: bool = False,
    max_steps_off_policy: int = 1,
    eval_every: int = 0,
    eval_scenarios: Sequence[Any] | None = None,
    eval_models: Sequence[ModelSpec] = (),
) -> list[StepRecord]:
    """Train until the model's step has advanced `steps` times; resumes from the current step.

    Each draw takes `groups_per_step` scenarios (from a list: a fixed shuffle per seed, cycled; or
    from a `ScenarioSource`), runs `rollouts_per_group` rollouts of each, and trains on the groups.
    A draw whose groups all have equal rewards carries no signal and does not advance the step (the
    record says so); it is followed by a fresh draw, up to `MAX_IDLE_DRAWS` in a row.
    `after_train(record, groups)` runs after every train call, before the next draw, and may add
    to the record's metrics (a curriculum retires inputs there, an evaluation runs there).

    `pipeline=True` keeps the next draws' rollouts running while a step trains, at most
    `max_steps_off_policy` steps behind the policy that trains on them (see `art_agents.loop.pipeline`);
    the same draws in the same order, with `after_train` running while later draws roll out.

    `eval_every=N` runs `art.evaluate` on `eval_scenarios` (held out: never the training scenarios) at the starting
    step and after every N-th step, beside `eval_models` (a frontier model, say), into the model's
    `eval/heldout/`; each step's mean held-out reward joins its record's metrics as `eval/reward`. With
    `pipeline=True` it runs while the next draws roll out, as `after_train` does.
    """
    if eval_every:
        after_train = await _evaluating(model, rollout, eval_every, eval_scenarios, eval_models, after_train)
    source = scenario_source(scenarios, seed)
    draws = Draws(model, rollout, source, groups_per_step, rollouts_per_group, max_exceptions, after_each)
    if pipeline:
        return await pipeline_loop(draws, steps, train_config, after_train, max_steps_off_policy)
    records: list[StepRecord] = []
    step = draw = await model.get_step()
    target, idle = step + steps, IdleDraws()
    while step < target:
        began = time.perf_counter()
        groups = await draws.run(draw, desc=f"step {step}")
        draw += 1
        rollout_s = time.perf_counter() - began
        if not groups:  # every group dropped (after_each) or failed within the budget: draw again
            idle.empty()
            continue
        result = await model.train(groups, train_config)
        record = StepRecord.of(result, step, groups, rollout_s, time.perf_counter() - began - rollout_s)
        records.append(record)
        if after_train is not None:
            await after_train(record, groups)
        idle.trained(result.step > step)
        step = result.step
    return records


async def _evaluating(
    model: TrainableModel,
    rollout: RolloutFn,
    every: int,
    scenarios: Sequence[Any] | None,
    models: Sequence[ModelSpec],
    after_train: AfterTrain | None,
) -> AfterTrain:
    """`after_train` followed by an evaluation after every `every`-th step, once the starting step is evaluated."""
    from art_agents.evaluation.run import PeriodicEvaluation

    if every < 0 or not scenarios:
        raise ValueError("eval_every needs eval_scenarios (a held-out list) and must be >= 0")
    periodic = PeriodicEvaluation(model, rollout, scenarios, models)
    await periodic(await model.get_step())

    async def then_evaluate(record: StepRecord, groups: list[TrajectoryGroup]) -> None:
        if after_train is not None:
            await after_train(record, groups)
        if record.advanced and record.step % every == 0:
            result = await periodic(record.step)
            mean = result.model(f"{model.name}@{record.step}").mean_reward
            if mean is not None:
                record.metrics["eval/reward"] = mean

    return then_evaluate


class TrainJob(Schema):
    """A training run described in a TOML file (`art-agents train job.toml`)."""

    name: str
    project: str = "default"
    base_model: str
    model: ModelConfig = Field(default_factory=ModelConfig)
    rollout: str = Field(description="`package.module:function`, an async (model, scenario) -> Trajectory.")
    scenarios: Path = Field(description="JSONL file; each line is one scenario passed to the rollout function.")
    backend: Literal["local", "remote"] = "local"
    art_path: Path = Path(".art")
    base_url: str | None = Field(None, description="Server URL when backend = 'remote'.")
    api_key: str | None = None
    steps: int = Field(10, ge=1)
    groups_per_step: int = Field(4, ge=1)
    rollouts_per_group: int = Field(4, ge=2)
    max_exceptions: float = Field(0.1, ge=0)
    seed: int = 0
    pipeline: bool = Field(
        False, description="Roll out the next draws while a step trains (see art_agents.loop.pipeline)."
    )
    max_steps_off_policy: int = Field(
        1, ge=0, description="With `pipeline`, how many steps behind the trained policy a draw's rollouts may be."
    )
    train: TrainConfig = Field(default_factory=TrainConfig)

    @classmethod
    def from_file(cls, path: Path) -> TrainJob:
        """Read a TOML job; relative `scenarios` and `art_path` are relative to the job file's folder."""
        import tomllib

        job = cls.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
        folder = path.resolve().parent
        return job.model_copy(update={"scenarios": folder / job.scenarios, "art_path": folder / job.art_path})


def load_function(path: str, kind: str = "rollout") -> Callable[..., Any]:
    """`package.module:function` -> the function; errors name `kind` (rollout, reward) and the fix."""
    module_name, _, attribute = path.partition(":")
    if not attribute:
        raise ValueError(f"{kind} {path!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"{kind} {path!r}: cannot import {module_name!r} ({exc}); put the module beside the job file "
            "or in the current folder, or install it"
        ) from exc
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ValueError(f"{kind} {path!r}: {module_name} has no function {attribute!r}")
    return function  # type: ignore[no-any-return]


def load_scenarios(path: Path) -> list[Any]:
    if not path.is_file():
        raise ValueError(f"scenarios file {path} does not exist")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        return [json.loads(line) for line in lines]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: every line must be one JSON scenario ({exc})") from exc


def job_model(job: TrainJob) -> AbstractAsyncContextManager[TrainableModel]:
    """The job's model, registered on its backend (the server at `base_url`, or a local one) while the block runs."""
    from art_agents.backends.registered import registered_model

    return registered_model(
        job.name,
        job.project,
        job.base_model,
        job.model,
        base_url=(job.base_url or "") if job.backend == "remote" else None,
        api_key=job.api_key,
        art_path=job.art_path,
    )


async def run_job(job: TrainJob) -> list[StepRecord]:
    if job.backend == "remote" and not job.base_url:
        raise ValueError("backend = 'remote' needs base_url")
    rollout, scenarios = load_function(job.rollout), load_scenarios(job.scenarios)  # fail before starting a server
    async with job_model(job) as model:
        return await train_loop(
            model,
            rollout,
            scenarios,
            steps=job.steps,
            groups_per_step=job.groups_per_step,
            rollouts_per_group=job.rollouts_per_group,
            train_config=job.train,
            max_exceptions=job.max_exceptions,
            seed=job.seed,
            pipeline=job.pipeline,
            max_steps_off_policy=job.max_steps_off_policy,
        )

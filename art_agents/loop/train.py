"""The standard training loop: rollouts in groups, optional scoring, one train call per step.

`art-agents train CONFIG.toml` runs it from a file; AutoRL and MCP•RL drive the same loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from art_agents.evaluation.targets import ModelSpec
from art_agents.gather import AfterEach
from art_agents.jobs import TrainJob, job_model, load_function, load_scenarios
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
from art_agents.train_config import TrainConfig
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

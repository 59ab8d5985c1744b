"""The pipelined loop: the next draws' rollouts run while a step trains, never more than
`max_steps_off_policy` steps behind the policy that trains on them.

Pacing, not discarding, keeps the bound. Draws are trained in the order they started, and draw `d`
(counted from 0 in this run) starts only once the trainer is done with draw `d - max_steps_off_policy`
(trained it, or found nothing to train in it). A train call advances the step at most once, so the
step that trains draw `d` is at most `max_steps_off_policy` ahead of the step served when its rollouts
began, however long any rollout takes; dropping slow rollouts instead would bias training toward
fast tasks. A group that is still too stale (another client trained the same model meanwhile) is
dropped and counted. The server refuses turns older than `TrainConfig.max_staleness`, which this
loop raises to the bound, and truncated importance sampling (`tis_cap`) is on unless set.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

from art_agents.loop.draws import AfterTrain, Draws, IdleDraws, StepRecord
from art_agents.train_config import TrainConfig
from art_agents.trajectory import TrajectoryGroup

# Truncated importance sampling cap of the pipelined loop unless `tis_cap` is set: TRL's default
# `vllm_importance_sampling_clip_max` for the same correction (a sampler that is not the trained policy).
PIPELINE_TIS_CAP = 3.0


def pipeline_config(config: TrainConfig | None, max_steps_off_policy: int) -> TrainConfig:
    """The config a pipelined step trains with: the server accepts turns as old as the bound, and `tis_cap` is on."""
    config = config or TrainConfig()
    if "max_staleness" in config.model_fields_set and config.max_staleness < max_steps_off_policy:
        raise ValueError(
            f"TrainConfig.max_staleness={config.max_staleness} would refuse turns that max_steps_off_policy="
            f"{max_steps_off_policy} lets through; leave max_staleness unset (the loop sets it) or raise it"
        )
    update: dict[str, Any] = {"max_staleness": max(config.max_staleness, max_steps_off_policy)}
    if "tis_cap" not in config.model_fields_set:
        update["tis_cap"] = PIPELINE_TIS_CAP
    return config.model_copy(update=update)


@dataclass
class _Draw:
    index: int
    served_step: int  # the step served when its rollouts started
    held_s: float  # how long pacing kept its rollouts from starting
    began: float
    task: asyncio.Task[list[TrajectoryGroup]]
    finished: float = 0.0

    def done(self, _: object) -> None:
        self.finished = time.perf_counter()


@dataclass
class _Counts:
    started: float
    rollouts_finished: int = 0
    rollouts_trained: int = 0
    stale_groups: int = 0


class _Pipeline:
    """One run: `start_draws` keeps rollouts going ahead, `next_draw` hands the trainer draws in order."""

    def __init__(self, draws: Draws, step: int, max_steps_off_policy: int) -> None:
        self.model, self.draws = draws.model, draws
        self.first_draw = self.step = step  # draws are numbered from the step, as in the synchronous loop
        self.ahead = max_steps_off_policy
        self.consumed = 0  # draws the trainer is done with
        self.pace = asyncio.Condition()
        self.ready: asyncio.Queue[_Draw | BaseException] = asyncio.Queue()  # started draws, in order
        self.running: list[_Draw] = []
        self.counts = _Counts(time.perf_counter())

    async def start_draws(self) -> None:
        """Start each draw as soon as the bound allows; an error reaches the trainer through the queue."""
        try:
            for index in itertools.count():
                held = time.perf_counter()
                async with self.pace:
                    await self.pace.wait_for(lambda index=index: self.consumed >= index - self.ahead)
                task = asyncio.create_task(
                    self.draws.run(self.first_draw + index, desc=f"draw {self.first_draw + index}")
                )
                began = time.perf_counter()
                draw = _Draw(index, self.step, began - held, began, task)
                task.add_done_callback(draw.done)
                self.running.append(draw)
                await self.ready.put(draw)
        except Exception as exc:
            await self.ready.put(exc)

    async def next_draw(self) -> tuple[_Draw, list[TrajectoryGroup], float]:
        """The oldest draw's groups (those not too stale) and how long the trainer waited for them."""
        waiting = time.perf_counter()
        draw = await self.ready.get()
        if isinstance(draw, BaseException):
            raise draw
        groups = await draw.task
        self.running.remove(draw)
        self.counts.rollouts_finished += sum(len(g.trajectories) + len(g.exceptions) for g in groups)
        self.step = await self.model.get_step()  # another client may have trained the model meanwhile
        fresh = [g for g in groups if not self._too_stale(g)]
        self.counts.stale_groups += len(groups) - len(fresh)
        return draw, fresh, time.perf_counter() - waiting

    def _too_stale(self, group: TrajectoryGroup) -> bool:
        sampled = [t.policy_step for tr in group.trajectories for t in tr.turns if t.policy_step is not None]
        return bool(sampled) and self.step - min(sampled) > self.ahead

    def metrics(self, draw: _Draw, trainer_wait_s: float) -> dict[str, float]:
        """Figures of this draw for the step's history row (`pipeline/...`)."""
        elapsed = time.perf_counter() - self.counts.started
        return {
            "pipeline/draw": float(self.first_draw + draw.index),
            "pipeline/staleness": float(self.step - draw.served_step),
            "pipeline/trainer_wait_s": trainer_wait_s,
            "pipeline/rollout_wait_s": draw.held_s,
            "pipeline/rollout_s": draw.finished - draw.began,
            "pipeline/rollouts_per_s": self.counts.rollouts_finished / elapsed,
            "pipeline/trained_rollouts_per_s": self.counts.rollouts_trained / elapsed,
            "pipeline/stale_groups_dropped": float(self.counts.stale_groups),
        }

    async def done_with(self, step: int) -> None:
        """The trainer is done with the oldest draw and `step` is served: the next draw may start."""
        async with self.pace:
            self.consumed += 1
            self.step = step
            self.pace.notify_all()

    async def stop(self, producer: asyncio.Task[None]) -> None:
        """Cancel the draws still running and the producer, and wait until they have let go."""
        producer.cancel()
        for draw in self.running:
            draw.task.cancel()
        await asyncio.gather(producer, *(d.task for d in self.running), return_exceptions=True)


async def pipeline_loop(
    draws: Draws,
    steps: int,
    train_config: TrainConfig | None,
    after_train: AfterTrain | None,
    max_steps_off_policy: int,
) -> list[StepRecord]:
    """`train_loop(..., pipeline=True)`: see the module docstring; resumes from the model's current step."""
    if max_steps_off_policy < 0:
        raise ValueError(f"max_steps_off_policy must be >= 0, got {max_steps_off_policy}")
    config = pipeline_config(train_config, max_steps_off_policy)
    model = draws.model
    step = await model.get_step()
    target, idle, records = step + steps, IdleDraws(), []
    pipeline = _Pipeline(draws, step, max_steps_off_policy)
    producer = asyncio.create_task(pipeline.start_draws())
    try:
        while step < target:
            draw, groups, waited = await pipeline.next_draw()
            step = pipeline.step
            if not groups:
                idle.empty()
                await pipeline.done_with(step)
                continue
            began, figures = time.perf_counter(), pipeline.metrics(draw, waited)
            result = await model.train(groups, config, metrics=figures)
            pipeline.counts.rollouts_trained += sum(len(g.trajectories) for g in groups)
            record = StepRecord.of(result, step, groups, draw.finished - draw.began, time.perf_counter() - began)
            record.metrics.update(figures)
            records.append(record)
            if after_train is not None:
                await after_train(record, groups)
            idle.trained(result.step > step)
            step = result.step
            await pipeline.done_with(step)
    finally:
        await pipeline.stop(producer)
    return records

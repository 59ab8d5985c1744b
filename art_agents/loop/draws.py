"""What the synchronous and the pipelined loop share: where scenarios come from, one draw's rollouts,
the record of a train call, and the count of draws that trained nothing."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import Field

from art_agents.errors import ArtError
from art_agents.gather import AfterEach, gather_trajectory_groups
from art_agents.model import TrainableModel
from art_agents.schema import Schema
from art_agents.trajectory import Trajectory, TrajectoryGroup
from art_agents.wire import TrainResult

RolloutFn = Callable[[TrainableModel, Any], Awaitable[Trajectory]]
AfterTrain = Callable[["StepRecord", list[TrajectoryGroup]], Awaitable[None]]
MAX_IDLE_DRAWS = 5  # draws in a row without a training signal before the loop gives up


class StepRecord(Schema):
    step: int = Field(description="The step served after this train call.")
    advanced: bool = Field(description="False when no group had a reward spread, so nothing trained.")
    reward_mean: float
    rollouts: int
    exceptions: int
    rollout_s: float = Field(description="Wall time of this draw's rollouts, from the first start to the last finish.")
    train_s: float
    metrics: dict[str, float] = Field(default_factory=dict)

    @classmethod
    def of(
        cls, result: TrainResult, before: int, groups: list[TrajectoryGroup], rollout_s: float, train_s: float
    ) -> StepRecord:
        """The record of the train call that took the step from `before` to `result.step`."""
        rewards = [r for g in groups for r in g.rewards()]
        return cls(
            step=result.step,
            advanced=result.step > before,
            reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
            rollouts=len(rewards),
            exceptions=sum(len(g.exceptions) for g in groups),
            rollout_s=rollout_s,
            train_s=train_s,
            metrics=dict(result.metrics),
        )


class ScenarioSource(Protocol):
    """Where each draw's scenarios come from: a pool that can change between draws (a curriculum)."""

    def pick(self, draw: int, count: int) -> list[Any]: ...


class ShuffledCycle:
    """A fixed list in one seeded shuffle, cycled: draw `d` takes the `d`-th slice of `count`."""

    def __init__(self, scenarios: Sequence[Any], seed: int = 0) -> None:
        if not scenarios:
            raise ValueError("train_loop needs at least one scenario")
        self.scenarios = scenarios
        self.order = list(range(len(scenarios)))
        random.Random(seed).shuffle(self.order)

    def pick(self, draw: int, count: int) -> list[Any]:
        return [self.scenarios[self.order[(draw * count + i) % len(self.order)]] for i in range(count)]


def scenario_source(scenarios: Sequence[Any] | ScenarioSource, seed: int) -> ScenarioSource:
    return ShuffledCycle(scenarios, seed) if isinstance(scenarios, Sequence) else scenarios


@dataclass(frozen=True)
class Draws:
    """How a loop draws: which scenarios, how many rollouts of each, how they are scored and failures counted."""

    model: TrainableModel
    rollout: RolloutFn
    source: ScenarioSource
    groups_per_step: int
    rollouts_per_group: int
    max_exceptions: int | float
    after_each: AfterEach | None

    async def run(self, draw: int, desc: str) -> list[TrajectoryGroup]:
        """Draw `draw`: one group per picked scenario; groups left empty (dropped, all failed) go."""
        picks = self.source.pick(draw, self.groups_per_step)
        groups = await gather_trajectory_groups(
            (TrajectoryGroup(self.rollout(self.model, s) for _ in range(self.rollouts_per_group)) for s in picks),
            pbar_desc=desc,
            max_exceptions=self.max_exceptions,
            after_each=self.after_each,
        )
        return [g for g in groups if g.trajectories]


class IdleDraws:
    """Draws in a row that trained nothing; the loop gives up at `MAX_IDLE_DRAWS` with the reason."""

    def __init__(self) -> None:
        self.count = 0

    def empty(self) -> None:
        """Every group was dropped (after_each) or failed within the budget."""
        self.count += 1
        if self.count >= MAX_IDLE_DRAWS:
            raise ArtError(f"{self.count} draws in a row left no group to train on; check the rollouts and after_each")

    def trained(self, advanced: bool) -> None:
        self.count = 0 if advanced else self.count + 1
        if self.count >= MAX_IDLE_DRAWS:
            raise ArtError(
                f"{self.count} draws in a row trained nothing: within every group all rollouts got the same reward, "
                "so there was no signal; make the reward tell attempts apart, or raise rollouts_per_group or "
                "temperature"
            )

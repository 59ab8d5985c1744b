"""The AutoRL input pool: draws what has been trained least, retires inputs that teach nothing.

A group whose rollouts all score the same carries no GRPO signal (the input is too easy or too hard
for the model now). After `retire_after` such draws an input is retired and the generator writes a
replacement, steered by what the model still fails at (the inputs with the lowest recent scores)
and away from what it already does well. The pool, with each input's counts, is saved after every
train call, so a resumed run draws exactly where it left off.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from art_agents.autorl.task_data import TaskInput
from art_agents.trajectory import TrajectoryGroup

FLAT = 1e-9  # rewards closer than this count as equal


class PoolInput(TaskInput):
    """A training input with what the loop has seen of it."""

    draws: int = 0
    flat_draws: int = Field(0, description="Draws whose group scores were all equal (no learning signal).")
    last_score: float | None = Field(None, description="Mean reward of its latest group.")
    retired_at_step: int | None = None


class Curriculum:
    """A `ScenarioSource` for `train_loop` over a pool that changes as inputs are retired and added."""

    def __init__(self, pool: Sequence[PoolInput], *, retire_after: int, seed: int = 0) -> None:
        if retire_after < 1:
            raise ValueError(f"retire_after must be at least 1, got {retire_after}")
        self.pool = list(pool)
        self.retire_after = retire_after
        self.seed = seed

    @property
    def active(self) -> list[PoolInput]:
        return [entry for entry in self.pool if entry.retired_at_step is None]

    def by_id(self) -> dict[str, PoolInput]:
        return {entry.id: entry for entry in self.pool}

    def pick(self, draw: int, count: int) -> list[PoolInput]:
        """The `count` active inputs drawn least so far (seeded order among equals); repeats if the pool is small."""
        active = self.active
        if not active:
            raise ValueError("the input pool has no active inputs left")
        shuffled = sorted(active, key=lambda e: random.Random(f"{self.seed}:{draw}:{e.id}").random())
        ranked = sorted(shuffled, key=lambda e: e.draws)
        return [ranked[i % len(ranked)] for i in range(count)]

    def observe(self, groups: Sequence[TrajectoryGroup]) -> None:
        """Count each scored group against its input: a draw, and a flat draw when the scores are all equal."""
        entries = self.by_id()
        for group in groups:
            rewards = group.rewards()
            if not rewards:
                continue
            entry = entries[group.trajectories[0].metadata["scenario_id"]]
            entry.draws += 1
            entry.last_score = sum(rewards) / len(rewards)
            if max(rewards) - min(rewards) <= FLAT:
                entry.flat_draws += 1

    def due(self) -> list[PoolInput]:
        """Active inputs that gave no signal `retire_after` times."""
        return [e for e in self.active if e.flat_draws >= self.retire_after]

    def retire(self, entries: Sequence[PoolInput], step: int) -> None:
        for entry in entries:
            entry.retired_at_step = step

    def add(self, entries: Sequence[PoolInput]) -> None:
        self.pool.extend(entries)

    def focus(self, limit: int = 5) -> str:
        """What the next inputs should be like: hard for the model now, unlike what it already does well."""
        scored = [e for e in self.active if e.last_score is not None and e.flat_draws < self.retire_after]
        failing = sorted(scored, key=lambda e: e.last_score or 0.0)[:limit]
        easy = [e for e in self.pool if e.retired_at_step is not None and (e.last_score or 0.0) >= 0.5][-limit:]
        parts = []
        if failing:
            listed = "\n".join(f"- {e.input[:300]}" for e in failing)
            parts.append(
                f"The model still does poorly on inputs like these; write new inputs of similar kinds:\n{listed}"
            )
        if easy:
            listed = "\n".join(f"- {e.input[:300]}" for e in easy)
            parts.append(f"The model already handles inputs like these; avoid writing more of them:\n{listed}")
        return "\n\n".join(parts)

"""Off-policy guidance for RL (as LUFFY, arXiv 2504.14945): a group in which no rollout reached `below` gets the
teacher's rollout of its task in place of its worst one, and the group is scored again.

After a warmup, the tasks a small model still fails are those where all its rollouts fail alike: a tied group,
which GRPO cannot learn from. With the teacher's solution in the group, the student's failures are pushed down and
the solution up, in the same step. A teacher's rollout that does not score best in the group is dropped (the group
stays as the student rolled it). Measured on the calculator benchmark: `benchmarks/mcp_rl_log.md`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from art_agents.distill import adopted
from art_agents.trajectory import Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from art_agents.autorl.scoring import GroupScorer
    from art_agents.model import Model

log = logging.getLogger(__name__)


class Guide:
    """An `after_each` for RL draws: scores each group with `scorer`, then guides it where its best is below `below`.

    `guided` counts the groups that took a teacher's rollout (the demonstrations RL used, to set beside an SFT run
    with as many)."""

    def __init__(
        self,
        teacher: Model,
        rollout: Callable[[Any, Any], Awaitable[Trajectory]],
        scorer: GroupScorer,
        below: float,
    ) -> None:
        self.teacher, self.rollout, self.scorer, self.below = teacher, rollout, scorer, below
        self.guided = 0

    async def __call__(self, group: TrajectoryGroup) -> TrajectoryGroup | None:
        scored = await self.scorer(group)
        if scored is None or not scored.trajectories or max(scored.rewards()) >= self.below:
            return scored
        scenario = self.scorer.scenario_of(scored.trajectories[0])
        try:
            demo = await self.rollout(self.teacher, scenario)
        except Exception as exc:  # guidance is help, not the run: the group trains as the student rolled it
            log.warning("the teacher %r failed on task %s, so its group is not guided: %s", self.teacher.name,
                        getattr(scenario, "id", "?"), exc)  # fmt: skip
            return scored
        if demo.failed:
            return scored
        worst = min(range(len(scored.trajectories)), key=lambda i: scored.trajectories[i].reward)
        candidate = [t.model_copy() for t in scored.trajectories]  # scoring again must not touch the student's group
        candidate[worst] = adopted(demo)
        rescored = await self.scorer(scored.model_copy(update={"trajectories": candidate}))
        if rescored is None or rescored.trajectories[worst].reward <= max(
            t.reward for i, t in enumerate(rescored.trajectories) if i != worst
        ):
            return scored
        self.guided += 1
        return rescored

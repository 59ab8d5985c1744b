"""Held-out evaluation: one rollout per val scenario, scored the way training scores.

The report is what a user compares before and after training: the mean score (judge or reward),
how often the task was completed, how often tool calls failed, and the cost of judging it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import Field

from art_agents.autorl.scoring import GroupScorer
from art_agents.gather import gather_trajectory_groups
from art_agents.schema import Schema
from art_agents.trajectory import Trajectory, TrajectoryGroup


class EvalItem(Schema):
    id: str
    score: float
    completed: bool
    tool_calls: int
    tool_errors: int
    answer: str | None = None


class EvalReport(Schema):
    step: int = Field(description="The checkpoint evaluated (0 is the base model).")
    scenarios: int
    failed: int = Field(description="Rollouts that raised (dead server, say); they score 0.")
    score: float = Field(description="Mean score over all scenarios, failed ones counted as 0.")
    completion_rate: float
    tool_error_rate: float = Field(description="Failed tool calls / tool calls (0 when none were made).")
    tool_calls_per_rollout: float
    judge_cost_usd: float = 0.0
    items: list[EvalItem] = Field(default_factory=list)


async def evaluate(
    scenarios: Sequence[Any],
    run_one: Callable[[Any], Awaitable[Trajectory]],
    scorer: GroupScorer,
    *,
    step: int,
    pbar_desc: str | None = "eval",
) -> EvalReport:
    """Run and score one rollout per scenario (each its own group, so the judge grades it alone)."""
    cost_before = scorer.cost_usd
    groups = await gather_trajectory_groups(
        (TrajectoryGroup([run_one(s)]) for s in scenarios),
        pbar_desc=pbar_desc,
        max_exceptions=len(scenarios),
        after_each=scorer,
    )
    trajectories = [t for g in groups for t in g.trajectories]
    items = [
        EvalItem(
            id=str(t.metadata.get("scenario_id")),
            score=t.reward,
            completed=bool(t.metrics.get("completed", False)),
            tool_calls=int(t.metrics.get("tool_calls", 0)),
            tool_errors=int(t.metrics.get("tool_errors", 0)),
            answer=t.metadata.get("answer"),
        )
        for t in trajectories
    ]
    count = len(scenarios)
    calls = sum(i.tool_calls for i in items)
    return EvalReport(
        step=step,
        scenarios=count,
        failed=count - len(items),
        score=sum(i.score for i in items) / count,
        completion_rate=sum(i.completed for i in items) / count,
        tool_error_rate=sum(i.tool_errors for i in items) / calls if calls else 0.0,
        tool_calls_per_rollout=calls / count,
        judge_cost_usd=scorer.cost_usd - cost_before,
        items=items,
    )

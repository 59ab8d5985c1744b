"""Rewards for AutoRL and MCP•RL groups: RULER with a rubric, or the user's own function.

Both come out as a gather `after_each` hook, so training and evaluation score the same way. The
judge's cost is added up as groups are scored, for the run's summary.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from art_agents.llm import CallTotals
from art_agents.trajectory import Trajectory, TrajectoryGroup

TOOL_USE_RUBRIC = """The agent was given a task and the tools of an MCP server.
- A trajectory that reaches the correct final answer (and reports it with complete_task) scores far above one that does not.
- Correct, well-formed tool calls that make progress beat invalid calls, calls to tools that do not exist, and guessing without the tools.
- Among equally correct trajectories, fewer wasted steps and clearer answers score higher.
- A trajectory that ran out of turns or gave no answer scores low."""

RewardFn = Callable[[Any, Trajectory], float | Awaitable[float]]


def feedback_hint(trajectory: Trajectory) -> str | None:
    """The judge's words on this rollout as its self-distillation hint: the teacher reads what went wrong (or right)
    and scores the rollout's own tokens with that in view."""
    explanation = trajectory.metadata.get("ruler_explanation")
    if not explanation:
        return None
    score = trajectory.metrics.get("ruler_score", trajectory.reward)
    return f"A reviewer judged an earlier attempt at this task (score {score:.2f} of 1): {explanation}"


class GroupScorer:
    """An `after_each` hook that scores each group; `cost_usd` totals what the judge charged and `seconds` the time
    spent scoring (rewards or judge calls; several groups may be scored at once)."""

    def __init__(
        self,
        scenarios: Mapping[str, Any],
        *,
        reward: RewardFn | None = None,
        judge_model: str | None = None,
        rubric: str = TOOL_USE_RUBRIC,
        judge_params: dict[str, Any] | None = None,
        hints: bool = False,
    ) -> None:
        if reward is None and judge_model is None:
            raise ValueError("give a judge model (RULER) or a reward function to score rollouts")
        self.scenarios = scenarios
        self.reward = reward
        self.judge_model = judge_model
        self.rubric = rubric
        self.judge_params = judge_params or {}
        self.hints = hints  # the judge's explanation of each rollout becomes its hint (self-distillation)
        self.cost_usd = 0.0
        self.cost_known = True
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.seconds = 0.0

    def account(self, spent: CallTotals) -> None:
        """Add judge calls made outside group scoring (pairwise comparisons) to the totals."""
        self.cost_usd += spent.cost_usd
        self.cost_known = self.cost_known and spent.cost_known
        self.prompt_tokens += spent.prompt_tokens
        self.completion_tokens += spent.completion_tokens

    def scenario_of(self, trajectory: Trajectory) -> Any:
        return self.scenarios[trajectory.metadata["scenario_id"]]

    async def __call__(self, group: TrajectoryGroup) -> TrajectoryGroup | None:
        began = time.perf_counter()
        try:
            return await self._score(group)
        finally:
            self.seconds += time.perf_counter() - began

    async def _score(self, group: TrajectoryGroup) -> TrajectoryGroup | None:
        if not group.trajectories:
            return group
        if self.reward is not None:
            for trajectory in group.trajectories:
                value = self.reward(self.scenario_of(trajectory), trajectory)
                trajectory.reward = float(await value if inspect.isawaitable(value) else value)
            return group
        return await self._judge(group)

    async def _judge(self, group: TrajectoryGroup) -> TrajectoryGroup | None:
        from art_agents.ruler import ruler_score_group

        rubric = self.rubric
        reference = getattr(self.scenario_of(group.trajectories[0]), "reference_answer", None)
        if reference:
            rubric += f"\n- The reference answer for this task is: {reference}"
        scored = await ruler_score_group(group, self.judge_model or "", rubric=rubric, **self.judge_params)
        for trajectory in scored.trajectories if scored is not None and self.hints else []:
            trajectory.hint = feedback_hint(trajectory)
        if scored is not None:
            summary = scored.metadata.get("ruler", {})
            self.cost_usd += float(summary.get("cost_usd", 0.0))
            self.cost_known = self.cost_known and bool(summary.get("cost_known", True))
            self.prompt_tokens += int(summary.get("prompt_tokens", 0))
            self.completion_tokens += int(summary.get("completion_tokens", 0))
        return scored

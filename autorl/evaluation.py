"""Held-out evaluation: one rollout per val scenario, scored the way training scores.

The report is what a user compares before and after training: the mean score (judge or reward),
how often the task was completed, how often tool calls failed, the cost of judging it, and (AutoRL)
how often a judge comparing answers side by side prefers the trained model's to the base model's.
Each report is saved as `eval/step_NNNN.json` in the run folder and reused on rerun.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pydantic import Field

from art_agents.autorl.run_folder import RunFolder
from art_agents.autorl.scoring import GroupScorer
from art_agents.errors import ArtError
from art_agents.gather import gather_trajectory_groups
from art_agents.ruler.pairwise import Outcome, compare_answers
from art_agents.schema import Schema
from art_agents.trajectory import Trajectory, TrajectoryGroup


class EvalItem(Schema):
    id: str
    score: float
    completed: bool
    tool_calls: int
    tool_errors: int
    answer: str | None = None
    versus_base: Outcome | None = Field(None, description="This answer against the base model's, by the judge.")


UNPRICED = "False when LiteLLM has no price for the judge: its cost then counts as 0, which is not what it cost."


class VersusBase(Schema):
    """Side-by-side judging of the same held-out inputs: this step's answers against the base model's."""

    wins: int
    losses: int
    ties: int
    win_rate: float = Field(description="(wins + ties / 2) / inputs: 0.5 means no better than the base model.")
    judge_cost_usd: float = 0.0
    judge_cost_known: bool = Field(True, description=UNPRICED)


class EvalReport(Schema):
    step: int = Field(description="The checkpoint evaluated (0 is the base model).")
    scenarios: int
    failed: int = Field(description="Rollouts that raised (dead server, say); they score 0.")
    score: float = Field(description="Mean score over all scenarios, failed ones counted as 0.")
    completion_rate: float
    tool_error_rate: float = Field(description="Failed tool calls / tool calls (0 when none were made).")
    tool_calls_per_rollout: float
    judge_cost_usd: float = 0.0
    judge_cost_known: bool = Field(True, description=UNPRICED)
    versus_base: VersusBase | None = None
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
        judge_cost_known=scorer.cost_known,
        items=items,
    )


async def compare_with_base(
    report: EvalReport,
    base: EvalReport,
    requests: Mapping[str, str],
    scorer: GroupScorer,
    *,
    instructions: str | None = None,
    seed: int = 0,
    concurrency: int = 8,
) -> EvalReport:
    """`report` with each answer judged against the base model's answer to the same input.

    The order the judge sees is shuffled per input (seeded); a side with no answer (its rollout
    failed) loses without a judge call.
    """
    if scorer.judge_model is None:
        raise ValueError("a win rate against the base model needs a judge model")
    current = {item.id: item for item in report.items}
    baseline = {item.id: item.answer for item in base.items}
    limit = asyncio.Semaphore(concurrency)
    cost_before = scorer.cost_usd

    async def outcome(input_id: str) -> Outcome:
        mine = current[input_id].answer if input_id in current else None
        theirs = baseline.get(input_id)
        if mine is None or theirs is None:
            return "tie" if mine == theirs else "loss" if mine is None else "win"
        swap = random.Random(f"{seed}:{report.step}:{input_id}").random() < 0.5
        async with limit:
            judged = await compare_answers(
                scorer.judge_model or "",
                requests[input_id],
                mine,
                theirs,
                scorer.rubric,
                instructions=instructions,
                swap=swap,
                **scorer.judge_params,
            )
        scorer.account(judged)
        return judged.outcome

    ids = list(requests)
    outcomes = dict(zip(ids, await asyncio.gather(*(outcome(i) for i in ids)), strict=True))
    counts = {kind: sum(o == kind for o in outcomes.values()) for kind in ("win", "loss", "tie")}
    versus = VersusBase(
        wins=counts["win"],
        losses=counts["loss"],
        ties=counts["tie"],
        win_rate=(counts["win"] + counts["tie"] / 2) / len(ids) if ids else 0.0,
        judge_cost_usd=scorer.cost_usd - cost_before,
        judge_cost_known=scorer.cost_known,
    )
    items = [item.model_copy(update={"versus_base": outcomes.get(item.id)}) for item in report.items]
    return report.model_copy(update={"versus_base": versus, "items": items})


async def saved_evaluation(
    folder: RunFolder, step: int, current: int, compute: Callable[[], Awaitable[EvalReport]]
) -> EvalReport:
    """The saved evaluation of `step`, or a new one of the model now served (which must be that step)."""
    name = f"eval/step_{step:04d}.json"
    saved = folder.read_json(name, EvalReport)
    if saved is not None:
        return saved
    if step != current:
        raise ArtError(
            f"{folder.path} has checkpoints up to step {current} but no evaluation of step {step}; "
            "rerun with --fresh to start over"
        )
    report = await compute()
    folder.write_json(name, report)
    return report

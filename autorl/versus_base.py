"""RULER-judged win rates against the base: where rewards are relative (RULER ranks each rollout against its own
group), two models' mean rewards are not on one scale, so a judge compares their answers side by side.

Each model's answer to a held-out scenario is judged against the first model's (the base, in a run's own
evaluation) by the run's rubric; the order the judge sees is shuffled per scenario (seeded), and a side with no
answer (its rollout failed) loses without a judge call. The verdicts join the evaluation's comparisons.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping

from art_agents.autorl.scoring import GroupScorer
from art_agents.evaluation.comparison import JudgedWins, PairComparison
from art_agents.evaluation.files import ScenarioRun, write_summary
from art_agents.evaluation.run import Evaluation
from art_agents.ruler.pairwise import Outcome, compare_answers


async def judge_versus_first(
    evaluation: Evaluation,
    requests: Mapping[str, str],
    scorer: GroupScorer,
    *,
    instructions: str | None = None,
    seed: int = 0,
    concurrency: int = 8,
) -> Evaluation:
    """`evaluation` with every comparison against its first model judged side by side (saved in its summary)."""
    summary = evaluation.summary
    if scorer.judge_model is None or len(summary.models) < 2:
        return evaluation
    base = summary.models[0].model
    answers = {label: {r.scenario_id: _answer(r) for r in runs} for label, runs in evaluation.runs.items()}
    limit = asyncio.Semaphore(concurrency)

    async def verdicts(comparison: PairComparison) -> PairComparison:
        if comparison.baseline != base:
            return comparison
        mine, theirs = answers.get(comparison.model, {}), answers.get(base, {})
        outcomes = await asyncio.gather(
            *(_outcome(scorer, limit, f"{seed}:{comparison.model}:{i}", text, mine.get(i), theirs.get(i), instructions)
              for i, text in requests.items())
        )  # fmt: skip
        counts = {kind: outcomes.count(kind) for kind in ("win", "loss", "tie")}
        rate = (counts["win"] + counts["tie"] / 2) / len(outcomes) if outcomes else None
        judged = JudgedWins(wins=counts["win"], losses=counts["loss"], ties=counts["tie"], win_rate=rate)
        return comparison.model_copy(update={"judged": judged})

    comparisons = [await verdicts(c) for c in summary.comparisons]
    summary = summary.model_copy(update={"comparisons": comparisons})
    if evaluation.folder is not None:
        write_summary(evaluation.folder, summary)
    return evaluation.model_copy(update={"summary": summary})


def _answer(run: ScenarioRun) -> str | None:
    """The scenario's answer: its first finished rollout's (`metadata["answer"]`, as both rollouts write it)."""
    return next((t.metadata.get("answer") for t in run.trajectories), None)


async def _outcome(
    scorer: GroupScorer,
    limit: asyncio.Semaphore,
    key: str,
    request: str,
    mine: str | None,
    theirs: str | None,
    instructions: str | None,
) -> Outcome:
    if mine is None or theirs is None:
        return "tie" if mine == theirs else "loss" if mine is None else "win"
    swap = random.Random(key).random() < 0.5
    async with limit:
        judged = await compare_answers(
            scorer.judge_model or "",
            request,
            mine,
            theirs,
            scorer.rubric,
            instructions=instructions,
            swap=swap,
            **scorer.judge_params,
        )
    scorer.account(judged)
    return judged.outcome

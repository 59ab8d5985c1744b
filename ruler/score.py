"""RULER scoring: judge a group relative to itself, optionally over several shuffled orders.

Judges favour positions (first or last shown). `passes=k` shows the group in k orders (as given,
reversed, then seeded shuffles, so reruns hit the cache), averages the scores, and reports how
well the passes agree (mean Kendall tau-b between the passes' scores) so a judge that mostly
reacts to position is visible in the metrics instead of silently steering training.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import random
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel

from art_agents.extras import require_extra
from art_agents.llm import DEFAULT_BACKOFF, Backoff, CallTotals, KeyProblem
from art_agents.ruler.cache import JudgeCache, default_cache_dir
from art_agents.ruler.judge import JudgeCall, Judgement, JudgeScore, judge
from art_agents.ruler.prompt import DEFAULT_RUBRIC, Messages, Tools, render_judge_messages, trajectory_ids
from art_agents.ruler.prompt import response_format as answer_schema
from art_agents.trajectory import TrajectoryGroup

logger = logging.getLogger(__name__)

DEFAULT_JUDGE = "openai/o4-mini"
DEFAULT_CACHE_DIR = default_cache_dir()


def pass_orders(count: int, passes: int) -> list[list[int]]:
    """Presentation orders: as given, reversed, then shuffles seeded by the pass number."""
    if passes < 1:
        raise ValueError(f"passes must be at least 1, got {passes}")
    orders = [list(range(count)), list(reversed(range(count)))][:passes]
    for index in range(2, passes):
        order = list(range(count))
        random.Random(index).shuffle(order)
        orders.append(order)
    return orders


# Hand-written: scipy.stats.kendalltau would need scipy, a dependency of no extra; tests/test_ruler_prompt.py checks
# it against scipy's published example and the textbook tie-group formula.
def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall tau-b of two score lists: 1 same ranking, -1 reversed; ties handled.

    When one list is all ties there is no ranking to compare: 1.0 if both are, else 0.0.
    """
    if len(a) != len(b):
        raise ValueError(f"score lists differ in length ({len(a)} vs {len(b)})")
    concordant = discordant = only_a_tied = only_b_tied = 0
    for i, j in itertools.combinations(range(len(a)), 2):
        da, db = (a[i] > a[j]) - (a[i] < a[j]), (b[i] > b[j]) - (b[i] < b[j])
        if da == 0 and db == 0:
            continue
        if da == 0:
            only_a_tied += 1
        elif db == 0:
            only_b_tied += 1
        elif da == db:
            concordant += 1
        else:
            discordant += 1
    denominator = math.sqrt((concordant + discordant + only_a_tied) * (concordant + discordant + only_b_tied))
    if denominator == 0:
        return 1.0 if only_a_tied == only_b_tied == 0 else 0.0
    return (concordant - discordant) / denominator


class RulerResult(CallTotals, BaseModel):
    """Scores in the order of the conversations given, with what each pass said and what it cost."""

    ids: list[str]
    scores: list[float]
    pass_scores: list[list[float]]
    explanations: list[list[str]]
    agreement: float | None = None
    calls: list[JudgeCall]

    # ART's `ruler()` returns a list of scores: indexing and iterating this result gives the same.
    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> JudgeScore:
        return JudgeScore(
            trajectory_id=self.ids[index], score=self.scores[index], explanation=" / ".join(self.explanations[index])
        )

    def __iter__(self) -> Iterator[JudgeScore]:  # type: ignore[override]  # BaseModel iterates its fields
        return (self[i] for i in range(len(self)))


async def ruler(
    message_lists: Sequence[Messages],
    judge_model: str = DEFAULT_JUDGE,
    extra_litellm_params: dict[str, Any] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    tools: Sequence[Tools] | Tools | None = None,
    *,
    debug: bool = False,
    passes: int = 1,
    max_attempts: int = 3,
    cache_dir: str | os.PathLike[str] | None = DEFAULT_CACHE_DIR,
    backoff: Backoff = DEFAULT_BACKOFF,
    **litellm_params: Any,
) -> RulerResult:
    """Score conversations relative to each other with one judge call per pass.

    The positional order is ART's. `judge_model` is any LiteLLM model string; `extra_litellm_params`
    and `litellm_params` (api_base, api_key, temperature, timeout...) go to `litellm.acompletion` as
    given; `response_format=None` sends no JSON schema, for endpoints that reject one (answers are
    validated either way). `tools`: one list for all conversations, or one per conversation.
    `cache_dir=None` disables the cache; the default folder is read from ART_AGENTS_RULER_CACHE at each call. `backoff` sets the waits before asking again after a
    timeout, rate limit or 5xx. `debug=True` logs each score with its explanation.
    """
    if not message_lists:
        raise ValueError("ruler needs at least one conversation to score")
    litellm_params = {**(extra_litellm_params or {}), **litellm_params}
    if tools is not None and (not tools or isinstance(tools[0], dict)):  # ART passes one list for all
        tools = [tools] * len(message_lists)  # type: ignore[list-item]
    ids = trajectory_ids(len(message_lists))
    answer_format = litellm_params.pop("response_format", answer_schema(ids))
    if cache_dir is DEFAULT_CACHE_DIR:  # the default, not a folder given: the environment may have changed since import
        cache_dir = default_cache_dir()
    cache = JudgeCache(cache_dir) if cache_dir is not None else None

    async def one_pass(pass_index: int, order: list[int]) -> Judgement:
        messages = render_judge_messages(message_lists, ids, rubric, tools=tools, order=order)
        judgement = await judge(
            messages,
            ids,
            judge_model,
            rubric,
            answer_format,
            max_attempts=max_attempts,
            cache=cache,
            litellm_params=litellm_params,
            backoff=backoff,
        )
        for call in judgement.calls:
            call.pass_index = pass_index
        return judgement

    tasks = [asyncio.ensure_future(one_pass(i, order)) for i, order in enumerate(pass_orders(len(ids), passes))]
    try:
        judgements = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:  # one failed pass makes the others pointless
            task.cancel()
        raise

    pass_scores = [[j.scores[i].score for i in ids] for j in judgements]
    agreements = [kendall_tau(a, b) for a, b in itertools.combinations(pass_scores, 2)]
    result = RulerResult(
        ids=ids,
        scores=[sum(column) / len(column) for column in zip(*pass_scores, strict=True)],
        pass_scores=pass_scores,
        explanations=[[j.scores[i].explanation for j in judgements] for i in ids],
        agreement=sum(agreements) / len(agreements) if agreements and len(ids) > 1 else None,
        calls=[call for j in judgements for call in j.calls],
    )
    if debug:
        for score in result:
            logger.info("RULER %s: %.3f (%s)", score.trajectory_id, score.score, score.explanation)
    return result


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: str = DEFAULT_JUDGE,
    extra_litellm_params: dict[str, Any] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    swallow_exceptions: bool = False,
    debug: bool = False,
    passes: int = 1,
    max_attempts: int = 3,
    cache_dir: str | os.PathLike[str] | None = DEFAULT_CACHE_DIR,
    backoff: Backoff = DEFAULT_BACKOFF,
    **litellm_params: Any,
) -> TrajectoryGroup | None:
    """A new group whose rewards are the judge's scores; usable as `after_each` in a gather.

    The positional order is ART's; LiteLLM parameters come as `extra_litellm_params={...}` (ART) or
    as keywords (`api_base=..., temperature=...`), merged.

    The original reward is kept in `metrics["independent_reward"]`, the score in
    `metrics["ruler_score"]`, the judge's explanation in `logs` and `metadata["ruler_explanation"]`. Judge cost and tokens are in
    `metadata["ruler"]` (per call) and as per-trajectory shares in metrics (a group's shares sum to
    its total). With `swallow_exceptions=True` a group the judge cannot score is dropped (None) and
    logged, instead of raising. Only the main history of each trajectory is shown to the judge.
    """
    require_extra("ruler", purpose="ruler_score_group", load=False)  # never a "dropped group" with swallow_exceptions
    if group.pending:
        raise ValueError("group still has unfinished rollouts; `await` it (or score it in gather's after_each) first")
    if not group.trajectories:
        return group.model_copy(deep=True)
    try:
        result = await ruler(
            [t.messages for t in group.trajectories],
            judge_model,
            extra_litellm_params,
            rubric,
            [t.tools for t in group.trajectories],
            debug=debug,
            passes=passes,
            max_attempts=max_attempts,
            cache_dir=cache_dir,
            backoff=backoff,
            **litellm_params,
        )
    except Exception as exc:
        if not swallow_exceptions or isinstance(exc.__cause__, KeyProblem):  # a key problem would drop every group
            raise
        logger.warning("RULER dropped a group of %d trajectories: %s", len(group.trajectories), exc)
        return None
    return _apply(group, result, judge_model)


def _apply(group: TrajectoryGroup, result: RulerResult, judge_model: str) -> TrajectoryGroup:
    scored = group.model_copy(deep=True)
    count = len(scored.trajectories)
    passes = len(result.pass_scores)
    for index, trajectory in enumerate(scored.trajectories):
        score = result.scores[index]
        trajectory.metrics.setdefault("independent_reward", trajectory.reward)  # a re-score keeps the first
        trajectory.metrics["ruler_score"] = score
        if result.cost_known:  # an unpriced judge has no cost to report, not a cost of 0
            trajectory.metrics["ruler_cost_usd"] = result.cost_usd / count
        trajectory.metrics["ruler_prompt_tokens"] = result.prompt_tokens / count
        trajectory.metrics["ruler_completion_tokens"] = result.completion_tokens / count
        trajectory.metrics["ruler_judge_calls"] = sum(not c.cached for c in result.calls)
        if result.agreement is not None:
            trajectory.metrics["ruler_agreement"] = result.agreement
        trajectory.metadata["ruler_explanation"] = " / ".join(result.explanations[index])
        for pass_index, explanation in enumerate(result.explanations[index]):
            label = f" pass {pass_index + 1}/{passes}" if passes > 1 else ""
            given = result.pass_scores[pass_index][index]
            trajectory.log(f"RULER ({judge_model}{label}) score {given:.3f}: {explanation}")
        trajectory.reward = score
    scored.metadata["ruler"] = {
        "judge_model": judge_model,
        "passes": passes,
        "agreement_kendall_tau": result.agreement,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "cost_usd": result.cost_usd,
        "cost_known": result.cost_known,
        "calls": [call.model_dump() for call in result.calls],
    }
    return scored

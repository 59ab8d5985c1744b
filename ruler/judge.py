"""One judged group: the LiteLLM call, answer validation, and re-asking with the problem named.

Local judges answer scores of 7, forget an id, or score one twice; ART's RULER then fails the
step. Here every answer is checked (each id exactly once, no strangers, scores in [0, 1]); a bad
answer is shown back to the judge with what was wrong, a timeout, rate limit or overloaded endpoint
is asked again after a backoff, at most `max_attempts` calls in all, after which `RulerError` says
what each attempt got.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from art_agents.errors import ArtError
from art_agents.llm import (
    DEFAULT_BACKOFF,
    Backoff,
    CannotCall,
    InvalidAnswer,
    KeyProblem,
    LLMCall,
    NoValidAnswer,
    ask_until_valid,
    load_json,
)
from art_agents.ruler.cache import JudgeCache


class RulerError(ArtError):
    """The judge gave no usable answer within the allowed attempts, or cannot be called at all."""

    @classmethod
    def of(cls, exc: CannotCall | NoValidAnswer) -> RulerError:
        """The error for a judge request that failed, with the fix for its kind of failure."""
        if isinstance(exc, KeyProblem):  # names the key and how to pass one
            return cls(f"judge {exc}")
        if isinstance(exc, CannotCall):
            return cls(
                f"judge {exc}. Check the model string, api_base and api_key (any LiteLLM model string works, e.g. "
                "'openai/gpt-4o-mini' or 'hosted_vllm/<name>' with api_base); pass response_format=None if it "
                "rejects JSON schemas"
            )
        fix = (
            "Check that the judge is running and its api_base, or give it more time (a `timeout` judge parameter)"
            if exc.unreachable
            else "Use a stronger judge, raise max_attempts, or pass swallow_exceptions=True to drop such groups"
        )
        return cls(f"judge {exc}. {fix}")


class InvalidJudgement(InvalidAnswer):
    """A judge answer that cannot be used; the message is shown back to the judge as is."""


class JudgeScore(BaseModel):
    trajectory_id: str
    explanation: str = ""
    score: float


class JudgeCall(LLMCall):
    """Accounting for one request to the judge, and the pass (presentation order) it belonged to."""

    pass_index: int = 0


class Judgement(BaseModel):
    scores: dict[str, JudgeScore]
    calls: list[JudgeCall]


def _as_score(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def parse_judgement(text: str | None, ids: Sequence[str]) -> dict[str, JudgeScore]:
    """Validate an answer against the ids shown; raise InvalidJudgement naming every problem."""
    if not text or not text.strip():
        raise InvalidJudgement("the answer was empty")
    try:
        data = load_json(text)
    except InvalidAnswer as exc:
        raise InvalidJudgement(str(exc)) from exc
    entries = data.get("scores") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise InvalidJudgement('the answer must be an object {"scores": [...]} with a list of score entries')
    expected = set(ids)
    problems: list[str] = []
    scores: dict[str, JudgeScore] = {}
    seen: set[str] = set()
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(f"scores[{position}] is not an object")
            continue
        trajectory_id = str(entry.get("trajectory_id", entry.get("id", "")))
        if trajectory_id not in expected:
            problems.append(
                f"scores[{position}] has trajectory_id {trajectory_id!r}, which is not one of the ids shown"
            )
            continue
        if trajectory_id in seen:
            problems.append(f"trajectory {trajectory_id} is scored more than once")
            continue
        seen.add(trajectory_id)
        score = _as_score(entry.get("score"))
        if score is None:
            problems.append(f"trajectory {trajectory_id} has score {entry.get('score')!r}, which is not a number")
        elif not 0.0 <= score <= 1.0:
            problems.append(f"trajectory {trajectory_id} has score {entry.get('score')!r}, outside the range [0, 1]")
        else:
            explanation = str(entry.get("explanation") or "")
            scores[trajectory_id] = JudgeScore(trajectory_id=trajectory_id, explanation=explanation, score=score)
    missing = [i for i in ids if i not in seen]
    if missing:
        problems.append(f"no score for {', '.join(missing)}")
    if problems:
        raise InvalidJudgement("; ".join(problems))
    return scores


def _reask(problem: str, ids: Sequence[str]) -> str:
    return (
        f"Your answer could not be used: {problem}. Answer again with JSON only: exactly one entry for each of "
        f"these ids, none other: {', '.join(ids)}; every score a number between 0 and 1 inclusive."
    )


async def judge(
    messages: list[dict[str, str]],
    ids: Sequence[str],
    judge_model: str,
    rubric: str,
    response_format: dict[str, Any] | None,
    *,
    max_attempts: int = 3,
    cache: JudgeCache | None = None,
    litellm_params: dict[str, Any] | None = None,
    backoff: Backoff = DEFAULT_BACKOFF,
) -> Judgement:
    """Ask the judge until it gives a valid answer, at most `max_attempts` requests."""
    key = JudgeCache.key(judge_model, rubric, messages, response_format or {})
    if cache is not None and (entry := cache.get(key)) is not None:
        try:
            return Judgement(scores=parse_judgement(entry.content, ids), calls=[JudgeCall(attempt=1, cached=True)])
        except InvalidJudgement:
            pass  # an entry that no longer validates is a miss
    try:
        answer = await ask_until_valid(
            judge_model,
            messages,
            lambda text: parse_judgement(text, ids),
            lambda problem: _reask(problem, ids),
            max_attempts=max_attempts,
            response_format=response_format,
            litellm_params=litellm_params,
            backoff=backoff,
        )
    except (CannotCall, NoValidAnswer) as exc:
        raise RulerError.of(exc) from exc
    calls = [JudgeCall(**call.model_dump()) for call in answer.calls]
    if cache is not None:
        last = calls[-1]
        cache.put(
            key,
            judge_model,
            answer.content,
            prompt_tokens=last.prompt_tokens,
            completion_tokens=last.completion_tokens,
            cost_usd=last.cost_usd,
        )
    return Judgement(scores=answer.value, calls=calls)

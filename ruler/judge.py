"""One judged group: the LiteLLM call, answer validation, and re-asking with the problem named.

Local judges answer scores of 7, forget an id, or score one twice; ART's RULER then fails the
step. Here every answer is checked (each id exactly once, no strangers, scores in [0, 1]); a bad
answer is shown back to the judge with what was wrong, a timeout or overloaded endpoint is asked
again, at most `max_attempts` calls in all, after which `RulerError` says what each attempt got.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from art_agents.errors import ArtError
from art_agents.ruler.cache import JudgeCache

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


class RulerError(ArtError):
    """The judge gave no usable answer within the allowed attempts, or cannot be called at all."""


class InvalidJudgement(ValueError):
    """A judge answer that cannot be used; the message is shown back to the judge as is."""


class JudgeScore(BaseModel):
    trajectory_id: str
    explanation: str = ""
    score: float


class JudgeCall(BaseModel):
    """Accounting for one request to the judge (or one cache hit, which costs nothing)."""

    attempt: int
    pass_index: int = 0
    cached: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = True
    latency_s: float = 0.0
    problem: str | None = None


class Judgement(BaseModel):
    scores: dict[str, JudgeScore]
    calls: list[JudgeCall]


def _load_json(text: str) -> Any:
    """JSON from a judge answer, tolerating code fences and chatter around one object."""
    candidates = [text.strip()]
    candidates += [m.strip() for m in _FENCE.findall(text)]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    error: json.JSONDecodeError | None = None
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError as exc:
            error = error or exc
    excerpt = text.strip()[:200] or "(empty)"
    raise InvalidJudgement(f"the answer is not valid JSON ({error}); it began: {excerpt!r}")


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
    data = _load_json(text)
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


def _retryable_errors() -> tuple[type[BaseException], ...]:
    import litellm

    return (
        litellm.Timeout,
        litellm.APIConnectionError,
        litellm.RateLimitError,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,
        litellm.BadGatewayError,
        TimeoutError,
    )


def _cost(response: Any) -> float | None:
    """LiteLLM's price of a response, or None for models missing from its price map (local judges)."""
    hidden = getattr(response, "_hidden_params", None) or {}
    if "response_cost" in hidden:  # computed by LiteLLM during the call; None when it has no price
        cost = hidden["response_cost"]
        return None if cost is None else float(cost)
    import litellm

    try:
        return float(litellm.completion_cost(completion_response=response))
    except Exception:  # LiteLLM raises for unpriced models; the cost is then unknown, not an error
        return None


def _accounting(response: Any, attempt: int, latency_s: float) -> JudgeCall:
    usage = getattr(response, "usage", None)
    cost = _cost(response)
    return JudgeCall(
        attempt=attempt,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cost_usd=cost or 0.0,
        cost_known=cost is not None,
        latency_s=latency_s,
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
) -> Judgement:
    """Ask the judge until it gives a valid answer, at most `max_attempts` requests."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    key = JudgeCache.key(judge_model, rubric, messages, response_format or {})
    if cache is not None and (entry := cache.get(key)) is not None:
        try:
            return Judgement(scores=parse_judgement(entry.content, ids), calls=[JudgeCall(attempt=1, cached=True)])
        except InvalidJudgement:
            pass  # an entry that no longer validates is a miss

    import litellm

    # Retries are this loop's job (it re-asks with the problem named); LiteLLM's own would multiply them.
    params: dict[str, Any] = {"num_retries": 0, "max_retries": 0, **(litellm_params or {})}
    if response_format is not None:
        params["response_format"] = response_format
    retryable = _retryable_errors()
    conversation = list(messages)
    calls: list[JudgeCall] = []
    for attempt in range(1, max_attempts + 1):
        started = time.perf_counter()
        try:
            response = await litellm.acompletion(model=judge_model, messages=conversation, **params)
        except retryable as exc:
            problem = f"{type(exc).__name__}: {exc}"
            calls.append(JudgeCall(attempt=attempt, latency_s=time.perf_counter() - started, problem=problem))
            continue
        except Exception as exc:
            raise RulerError(
                f"judge {judge_model!r} cannot be called: {type(exc).__name__}: {exc}. Check the model string, "
                "api_base and api_key (any LiteLLM model string works, e.g. 'openai/gpt-4o-mini' or "
                "'hosted_vllm/<name>' with api_base); pass response_format=None if it rejects JSON schemas"
            ) from exc
        call = _accounting(response, attempt, time.perf_counter() - started)
        calls.append(call)
        content = response.choices[0].message.content
        try:
            scores = parse_judgement(content, ids)
        except InvalidJudgement as exc:
            call.problem = str(exc)
            conversation += [
                {"role": "assistant", "content": content or ""},
                {"role": "user", "content": _reask(str(exc), ids)},
            ]
            continue
        if cache is not None:
            cache.put(
                key,
                judge_model,
                content,
                prompt_tokens=call.prompt_tokens,
                completion_tokens=call.completion_tokens,
                cost_usd=call.cost_usd,
            )
        return Judgement(scores=scores, calls=calls)
    history = "\n".join(f"  attempt {c.attempt}: {c.problem}" for c in calls)
    raise RulerError(
        f"judge {judge_model!r} gave no usable answer in {max_attempts} attempts:\n{history}\n"
        "Use a stronger judge, raise max_attempts, or pass swallow_exceptions=True to drop such groups"
    )

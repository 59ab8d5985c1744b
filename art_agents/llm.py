"""One LiteLLM conversation that asks again until the answer validates, with its cost accounted.

The RULER judge and the AutoRL/MCP•RL generators share it, so it sits in the core below both: a bad
answer is shown back to the model with the problem named at once, a timeout, rate limit or overloaded
endpoint is asked again after a `Backoff` wait (the server's Retry-After when it sends one), at most
`max_attempts` requests in all (LiteLLM's own retries are off, so the bound is real and every request
is seen), and every request's tokens and price are kept. LiteLLM is imported at the first call.

LiteLLM fetches its model price map from GitHub at import: offline that is about 8 s and four warnings, so the
map bundled with LiteLLM is the default here. Set `LITELLM_LOCAL_MODEL_COST_MAP=False` for the fresh one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from art_agents.errors import ArtError

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
NO_KEY = "none"  # the key sent to an api_base of your own when none is given or set

logger = logging.getLogger(__name__)
# Before any `import litellm` that comes through art_agents (RULER, AutoRL, MCP•RL, a notebook importing them first).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


class LLMCall(BaseModel):
    """Accounting for one request (or one cache hit, which costs nothing)."""

    attempt: int
    cached: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = True
    latency_s: float = 0.0
    problem: str | None = None
    reached: bool = True  # False: the request itself failed (timeout, connection refused, overloaded)


class CallTotals:
    """Totals over `calls`, for results that paid for LLM requests (a judgement, a generation)."""

    calls: Sequence[LLMCall]

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.calls)

    @property
    def cost_usd(self) -> float:
        return sum(c.cost_usd for c in self.calls)

    @property
    def cost_known(self) -> bool:
        """False when any paid call's model is missing from LiteLLM's price map (its cost counts as 0)."""
        return all(c.cost_known for c in self.calls)


class Answer(BaseModel, Generic[T]):
    """A validated answer, the raw text it came from, and every request it took."""

    value: T
    content: str
    calls: list[LLMCall]


class InvalidAnswer(ValueError):
    """An answer that cannot be used; the message is shown back to the model as is."""


class CannotCall(ArtError):
    """The model cannot be called at all (unknown provider, bad key, rejected request)."""


class KeyProblem(CannotCall):
    """No API key where the provider needs one, or a key it refuses (401): asking again cannot help."""


class NoValidAnswer(ArtError):
    """Every attempt failed; `calls` says what each one got."""

    def __init__(self, model: str, calls: list[LLMCall]) -> None:
        what = "could not be reached" if self.unreachable_in(calls) else "gave no usable answer"
        last = " ".join(str(calls[-1].problem).split()) if calls else "no attempt made"
        super().__init__(f"{model!r} {what} in {len(calls)} attempts (last: {last})")  # one line, for the CLI
        for call in calls:  # every attempt, in the traceback a log file keeps
            self.add_note(f"attempt {call.attempt}: {call.problem}")
        self.calls = calls

    @property
    def unreachable(self) -> bool:
        """Every attempt failed before an answer came back: the endpoint is down, slow or overloaded."""
        return self.unreachable_in(self.calls)

    @staticmethod
    def unreachable_in(calls: Sequence[LLMCall]) -> bool:
        return bool(calls) and not any(c.reached for c in calls)


def load_json(text: str) -> Any:
    """JSON from a model's answer, tolerating code fences and chatter around one object."""
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
    raise InvalidAnswer(f"the answer is not valid JSON ({error}); it began: {excerpt!r}")


def validation_problems(exc: ValidationError, root: str = "answer") -> str:
    """A pydantic error as the model is told it: each field's path and what is wrong with it."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or root}: {e['msg']}" for e in exc.errors())


def import_litellm() -> Any:
    """LiteLLM without its "Give Feedback / Get Help" banners on stdout: our errors already name the fix."""
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def missing_keys(model: str, api_key: str | None = None) -> list[str]:
    """The variables of an API key that `model`'s provider needs and that are unset (none when `api_key` is
    given), as LiteLLM's `validate_environment` names them. Settings that are not keys (regions, projects, AWS
    credentials a role may supply) are not asked for."""
    if api_key:
        return []
    litellm = import_litellm()
    try:
        provider = litellm.get_llm_provider(model=model)[1]
    except Exception:  # an unknown provider: the request names it, as LiteLLM words it
        return []
    if litellm.api_key or getattr(litellm, f"{provider}_key", None):  # set in code, as LiteLLM allows
        return []
    named = litellm.validate_environment(model=model)["missing_keys"]
    return [v for v in named if v.endswith(("_API_KEY", "_API_TOKEN")) and not os.environ.get(v)]


def check_key(
    model: str, litellm_params: Mapping[str, Any] | None = None, *, role: str = "", option: str = "api_key"
) -> dict[str, Any]:
    """`litellm_params` ready for a request to `model`, or KeyProblem naming the variable and `option` (the flag or
    keyword that passes a key) when its provider needs a key that is neither given nor set: found before any
    request, instead of a connection error after every retry.

    An api_base of your own may need no key: there a placeholder stands in for a missing one, since OpenAI's
    client will not start without one (an endpoint that does want a key answers 401, which is named as such).
    """
    params = dict(litellm_params or {})
    if not (missing := missing_keys(model, params.get("api_key"))):
        return params
    if params.get("api_base") or params.get("base_url"):
        return {**params, "api_key": NO_KEY}
    who = f"{role} {model!r}" if role else repr(model)
    raise KeyProblem(f"{who} needs an API key: set {' or '.join(missing)}, or pass {option}")


def retryable_errors() -> tuple[type[BaseException], ...]:
    litellm = import_litellm()
    return (
        litellm.Timeout,
        litellm.APIConnectionError,
        litellm.RateLimitError,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,
        litellm.BadGatewayError,
        TimeoutError,
    )


# A few lines of our own, not LiteLLM's retries (they hide requests from the bound and the accounting)
# nor tenacity (not a dependency of litellm, so it would be one more for the `ruler` extra).
class Backoff(BaseModel):
    """How long to wait before asking again after a timeout, rate limit or 5xx.

    Asking an overloaded endpoint again at once only adds to its load and spends the attempts in
    milliseconds. The n-th wait is `initial_s * 2**(n-1)` capped at `max_s`, shortened at random by up
    to `jitter` of itself so that many callers throttled together do not return together. A server's
    `Retry-After` (or `retry-after-ms`) is waited at least, still capped at `max_s`.
    """

    model_config = ConfigDict(frozen=True)

    initial_s: float = Field(1.0, ge=0, description="The first wait, in seconds; each further one doubles.")
    max_s: float = Field(60.0, ge=0, description="No wait is longer, not even one a Retry-After asks for.")
    jitter: float = Field(0.5, ge=0, le=1, description="The largest random share taken off a wait (1: full jitter).")

    def wait_s(self, failures: int, retry_after_s: float | None = None) -> float:
        """The wait after the `failures`-th failed request (1 for the first)."""
        exponent = min(failures - 1, 64)  # past any sensible max_s; keeps 2**n a finite float
        wait = min(self.max_s, self.initial_s * 2.0**exponent) * (1 - self.jitter * random.random())
        if retry_after_s is not None:
            wait = max(wait, retry_after_s)
        return min(self.max_s, wait)


DEFAULT_BACKOFF = Backoff()


def retry_after_s(exc: BaseException) -> float | None:
    """The wait a failed response asked for in `retry-after-ms` or `Retry-After` (seconds or an HTTP
    date), or None when it named none."""
    headers: Mapping[str, str] | None = getattr(exc, "litellm_response_headers", None) or getattr(
        getattr(exc, "response", None), "headers", None
    )
    if not headers:
        return None
    lowered = {str(k).lower(): str(v).strip() for k, v in headers.items()}
    if (milliseconds := _number(lowered.get("retry-after-ms", ""))) is not None:
        return milliseconds / 1000
    value = lowered.get("retry-after", "")
    if (seconds := _number(value)) is not None or not value:
        return seconds
    try:
        return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):  # neither seconds nor a date: ignored, as HTTP clients do
        return None


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _cost(response: Any) -> float | None:
    """LiteLLM's price of a response, or None for models missing from its price map (local models)."""
    hidden = getattr(response, "_hidden_params", None) or {}
    if "response_cost" in hidden:  # computed by LiteLLM during the call; None when it has no price
        cost = hidden["response_cost"]
        return None if cost is None else float(cost)
    litellm = import_litellm()
    try:
        return float(litellm.completion_cost(completion_response=response))
    except Exception:  # LiteLLM raises for unpriced models; the cost is then unknown, not an error
        return None


def accounting(response: Any, attempt: int, latency_s: float) -> LLMCall:
    usage = getattr(response, "usage", None)
    cost = _cost(response)
    return LLMCall(
        attempt=attempt,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cost_usd=cost or 0.0,
        cost_known=cost is not None,
        latency_s=latency_s,
    )


async def ask_until_valid(
    model: str,
    messages: list[dict[str, str]],
    parse: Callable[[str | None], T],
    reask: Callable[[str], str],
    *,
    max_attempts: int = 3,
    response_format: dict[str, Any] | None = None,
    litellm_params: dict[str, Any] | None = None,
    backoff: Backoff = DEFAULT_BACKOFF,
) -> Answer[T]:
    """Call `model` until `parse` accepts its answer (raising InvalidAnswer otherwise).

    `reask(problem)` is the user message that follows a rejected answer, sent at once; a request that
    fails in transit (`retryable_errors`) is sent again after `backoff`'s wait. Raises CannotCall for
    an error that asking again cannot fix (KeyProblem for a missing key, before any request, or a refused
    one), NoValidAnswer when every attempt failed.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    params: dict[str, Any] = {"num_retries": 0, "max_retries": 0, **check_key(model, litellm_params)}
    litellm = import_litellm()
    if response_format is not None:
        params["response_format"] = response_format
    retryable = retryable_errors()
    conversation = list(messages)
    calls: list[LLMCall] = []
    for attempt in range(1, max_attempts + 1):
        started = time.perf_counter()
        try:
            response = await litellm.acompletion(model=model, messages=conversation, **params)
        except retryable as exc:
            calls.append(
                LLMCall(
                    attempt=attempt,
                    latency_s=time.perf_counter() - started,
                    problem=f"{type(exc).__name__}: {exc}",
                    reached=False,
                )
            )
            if attempt < max_attempts:
                asked = retry_after_s(exc)
                wait = backoff.wait_s(sum(not c.reached for c in calls), asked)
                logger.warning(
                    "%s: attempt %d of %d failed (%s); asking again in %.2f s%s",
                    model,
                    attempt,
                    max_attempts,
                    type(exc).__name__,
                    wait,
                    "" if asked is None else f" (Retry-After: {asked:g} s)",
                )
                await asyncio.sleep(wait)
            continue
        except litellm.AuthenticationError as exc:
            raise KeyProblem(f"{model!r} refused the API key (401 authentication error): {exc}") from exc
        except Exception as exc:
            raise CannotCall(f"{model!r} cannot be called: {type(exc).__name__}: {exc}") from exc
        call = accounting(response, attempt, time.perf_counter() - started)
        calls.append(call)
        content = response.choices[0].message.content
        try:
            value = parse(content)
        except InvalidAnswer as exc:
            call.problem = str(exc)
            conversation += [
                {"role": "assistant", "content": content or ""},
                {"role": "user", "content": reask(str(exc))},
            ]
            continue
        return Answer[T](value=value, content=content or "", calls=calls)
    raise NoValidAnswer(model, calls)


async def ask_for_object(
    model: str,
    messages: list[dict[str, str]],
    kind: type[M],
    *,
    schema_name: str,
    example: str,
    max_attempts: int = 3,
    litellm_params: dict[str, Any] | None = None,
    backoff: Backoff = DEFAULT_BACKOFF,
) -> Answer[M]:
    """One JSON object validated as `kind` (asked for with its JSON schema), re-asked with the problem
    named and `example` (the expected shape) until it validates."""

    def parse(text: str | None) -> M:
        if not text or not text.strip():
            raise InvalidAnswer("the answer was empty")
        try:
            return kind.model_validate(load_json(text))
        except ValidationError as exc:
            raise InvalidAnswer(f"the answer does not follow the format ({validation_problems(exc)})") from exc

    return await ask_until_valid(
        model,
        messages,
        parse,
        lambda problem: f"Your answer could not be used: {problem}. Answer again with JSON only: {example}",
        max_attempts=max_attempts,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": schema_name, "schema": kind.model_json_schema()},
        },
        litellm_params=litellm_params,
        backoff=backoff,
    )

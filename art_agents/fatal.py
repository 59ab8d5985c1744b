"""Rollout errors that stop a gather at once instead of counting as one failed rollout.

These are errors every rollout would hit, so counting them against `max_exceptions` only delays
and hides the fix: a model that is not registered (`SetupError`), a missing optional dependency
(any `ImportError`), a server that cannot be reached, and a chat API answering 404 (unknown model,
wrong base URL) or 401 (wrong API key).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from art_agents.errors import SetupError

_STATUS_FIXES = {
    401: "set the model's inference_api_key (or the backend's api_key) to a key that server accepts",
    404: "use a model name that server serves (GET /v1/models lists them) and a base URL ending in /v1",
}


def fatal_error(exc: BaseException) -> BaseException | None:
    """The error to raise in place of `exc` (a cause of it, or a SetupError naming the fix), or None to count it."""
    for link in _causes(exc):
        if isinstance(link, SetupError | ImportError):
            return link
        if _is(link, "httpx", "ConnectError"):
            error = SetupError(
                f"cannot connect to {_url(link)} ({link}); start that server, or point the model at one that runs"
            )
            error.__cause__ = link
            return error
        status = getattr(link, "status_code", None)
        if _is(link, "openai", "APIStatusError") and status in _STATUS_FIXES:
            error = SetupError(f"{_url(link)} answered {status} ({_detail(link)}); {_STATUS_FIXES[status]}")
            error.__cause__ = link
            return error
    return None


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and its explicit causes (`raise ... from`: RolloutFailed, the OpenAI SDK, httpx), never mere context."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__


def _is(exc: BaseException, module: str, name: str) -> bool:
    """isinstance against `module.name` without importing the module: unimported, it raised nothing."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(exc, getattr(loaded, name))


def _url(exc: BaseException) -> str:
    try:
        return str(exc.request.url)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError for an error without its request
        return "the server"


def _detail(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        detail = body.get("detail") or body.get("message")
        if isinstance(detail, str):
            return detail
    return str(exc)

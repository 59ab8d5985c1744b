"""Run awaitables together so that one failure (or a cancel) stops the rest instead of orphaning them; `retry` a
flaky call with a growing delay (ART's `art.retry`, re-exported by `art_agents.utils`)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger(__name__)


async def gather_or_cancel(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """`asyncio.gather`, except that when one raises the others are cancelled and awaited before it propagates.

    Tasks cancelled before their first step close their coroutines, so none is left "never awaited".
    """
    tasks = [asyncio.ensure_future(item) for item in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def close_unstarted(items: Iterable[Awaitable[object]]) -> None:
    """Close coroutines that never ran (their gather stopped first), so none warns that it was never awaited."""
    for item in items:
        if inspect.iscoroutine(item) and inspect.getcoroutinestate(item) == inspect.CORO_CREATED:
            item.close()


def retry(
    max_attempts: int = 3,
    delay: float = 0.25,
    backoff_factor: float = 2.0,
    exceptions: tuple[type[BaseException], ...] = (Exception,),
    on_retry: Callable[[BaseException, int], None] | None = None,
) -> Callable[[F], F]:
    """ART's `@art.retry`: call the (sync or async) function again when it raises one of `exceptions`,
    at most `max_attempts` calls, waiting `delay` seconds times `backoff_factor` per failure before
    each new one. `on_retry(exception, attempt)` replaces the warning logged for each failure."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")

    def failed(func: Callable[..., Any], exc: BaseException, attempt: int) -> float:
        if on_retry is not None:
            on_retry(exc, attempt)
        else:
            logger.warning(
                "retry %d/%d of %s after %s: %s", attempt, max_attempts, func.__name__, type(exc).__name__, exc
            )
        return delay * backoff_factor ** (attempt - 1)

    def decorate(func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                for attempt in range(1, max_attempts + 1):
                    try:
                        return await func(*args, **kwargs)
                    except exceptions as exc:
                        if attempt == max_attempts:
                            raise
                        await asyncio.sleep(failed(func, exc, attempt))
                raise AssertionError("unreachable")

            return call_async  # type: ignore[return-value]

        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            for attempt in range(1, max_attempts + 1):
                try:
                    return func(*args, **kwargs)
                except exceptions as exc:
                    if attempt == max_attempts:
                        raise
                    time.sleep(failed(func, exc, attempt))
            raise AssertionError("unreachable")

        return call  # type: ignore[return-value]

    return decorate

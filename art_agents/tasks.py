"""Run awaitables together so that one failure (or a cancel) stops the rest instead of orphaning them."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


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

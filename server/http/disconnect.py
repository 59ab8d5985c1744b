"""A client that hangs up stops its generation at the next token, whatever the protocol."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

from art_agents.server.serving.completions import ChatPlan

T = TypeVar("T")


async def watch_disconnect(request: Request, cancel: threading.Event, every_s: float = 0.25) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(every_s)
    cancel.set()


async def watched(http: Request, plan: ChatPlan, work: Awaitable[T]) -> T:
    """`work`, with a client that hangs up meanwhile stopping `plan`'s generation at the next token."""
    watcher = asyncio.create_task(watch_disconnect(http, plan.cancel))
    try:
        return await work
    finally:
        watcher.cancel()

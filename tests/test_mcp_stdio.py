"""The stdio transport against a real server whose answers are hard on a client: invalid UTF-8 and huge results."""

from __future__ import annotations

import asyncio
import time

from mcp_fixtures import UNRULY_COMMAND

from art_agents import rollout
from art_agents.integrations.mcp import TRUNCATED_METRIC, MCPServer, MCPSession


async def test_invalid_utf8_on_stdout_is_replaced_and_the_session_goes_on() -> None:
    async with MCPServer(command=[*UNRULY_COMMAND, "--latin1"], tool_timeout_s=5).session() as session:
        for _ in range(2):  # the session survives the bad byte: the next call is answered too
            started = time.monotonic()
            result = await session.call_tool("word")
            assert (result.content, result.is_error) == ("caf\ufffd", False)
            assert time.monotonic() - started < 2  # answered at once, not at the tool timeout
        assert (await session.call_tool("echo", {"text": "still here"})).content == "still here"


async def pings(session: MCPSession, latencies: list[float]) -> None:
    """Call `echo` every 0.1 s, noting how long each answer took."""
    while True:
        started = time.monotonic()
        assert (await session.call_tool("echo", {"text": "ping"})).content == "ping"
        latencies.append(time.monotonic() - started)
        await asyncio.sleep(0.1)


async def test_a_huge_result_is_cut_to_max_result_chars_and_counted() -> None:
    async with MCPServer(command=UNRULY_COMMAND, tool_timeout_s=20).session() as session:
        async with rollout() as trajectory:
            started = time.monotonic()
            result = await session.call_tool("big", {"megabytes": 20})
            took = time.monotonic() - started
            small = await session.call_tool("echo", {"text": "short"})
        limit = session.server.max_result_chars
        assert (
            result.content
            == "x" * limit + f"\n[truncated: the first {limit:,} of 20,000,000 characters (max_result_chars)]"
        )
        assert not result.is_error and small.content == "short"
        assert trajectory.metrics[TRUNCATED_METRIC] == 1
        assert [call.result for call in trajectory.tool_calls] == [result.content, "short"]
        assert took < 15, f"a 20 MB answer took {took:.1f}s to read"


async def test_a_50_mb_answer_is_discarded_while_the_session_stays_responsive() -> None:
    async with MCPServer(command=UNRULY_COMMAND, tool_timeout_s=20).session() as session:
        latencies: list[float] = []
        pinger = asyncio.create_task(pings(session, latencies))
        started = time.monotonic()
        result = await session.call_tool("big", {"megabytes": 50})  # a 100 MB line: text and structured content
        took = time.monotonic() - started
        await asyncio.sleep(0.3)
        pinger.cancel()
        assert result.is_error and "over max_message_bytes=67108864, and was discarded" in result.content
        assert "raise MCPServer(max_message_bytes=...)" in result.content
        assert took < 15, f"a 50 MB answer took {took:.1f}s to read and discard"  # was past a minute
        assert len(latencies) >= 2 and max(latencies) < took + 1, latencies  # the ping queued behind it, no more
        assert (await session.call_tool("echo", {"text": "after"})).content == "after"

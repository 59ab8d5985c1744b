"""The stdio transport against a real server whose answers are hard on a client: invalid UTF-8 and huge results."""

from __future__ import annotations

import asyncio
import time

from mcp_fixtures import UNRULY_COMMAND

from art_agents import rollout
from art_agents.integrations.mcp import TRUNCATED_METRIC, MCPServer, MCPSession


async def test_invalid_utf8_on_stdout_is_replaced_and_the_session_goes_on() -> None:
    async with MCPServer(command=[*UNRULY_COMMAND, "--latin1"], tool_timeout_s=60).session() as session:
        for _ in range(2):  # the session survives the bad byte: the next call is answered too, not timed out
            result = await session.call_tool("word")
            assert (result.content, result.is_error) == ("caf\ufffd", False)
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
            started = time.process_time()
            result = await session.call_tool("big", {"megabytes": 20})
            cpu_s = time.process_time() - started
            small = await session.call_tool("echo", {"text": "short"})
        limit = session.server.max_result_chars
        assert (
            result.content
            == "x" * limit + f"\n[truncated: the first {limit:,} of 20,000,000 characters (max_result_chars)]"
        )
        assert not result.is_error and small.content == "short"
        assert trajectory.metrics[TRUNCATED_METRIC] == 1
        assert [call.result for call in trajectory.tool_calls] == [result.content, "short"]
        assert cpu_s < 15, f"a 20 MB answer took {cpu_s:.1f} s of CPU to read"


async def test_a_50_mb_answer_is_discarded_while_the_session_stays_responsive() -> None:
    async with MCPServer(command=UNRULY_COMMAND, tool_timeout_s=20).session() as session:
        latencies: list[float] = []
        pinger = asyncio.create_task(pings(session, latencies))
        started = time.monotonic()
        cpu_started = time.process_time()
        result = await session.call_tool("big", {"megabytes": 50})  # a 100 MB line: text and structured content
        took = time.monotonic() - started
        cpu_s = time.process_time() - cpu_started
        answered = len(latencies)
        async with asyncio.timeout(60):  # the pings go on after it
            while len(latencies) < answered + 2:
                await asyncio.sleep(0.05)
        pinger.cancel()
        assert result.is_error and "over max_message_bytes=67108864, and was discarded" in result.content
        assert "raise MCPServer(max_message_bytes=...)" in result.content
        assert cpu_s < 15, f"a 50 MB answer took {cpu_s:.1f} s of CPU to read and discard"  # was past a minute
        assert max(latencies) < 2 * took + 1, latencies  # a ping queued behind it (sent before it), no more
        assert (await session.call_tool("echo", {"text": "after"})).content == "after"

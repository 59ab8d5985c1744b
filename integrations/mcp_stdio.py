"""The stdio transport of MCP sessions: the SDK's process handling around a line reader of our own.

The SDK's reader decodes strictly, so one byte of invalid UTF-8 ends the session without a word
(every later call then times out), and it joins a long line chunk by chunk, quadratic in its length
(a 100 MB answer took a minute, the session deaf meanwhile). This reader decodes with replacement,
joins each line once, discards a line over `max_line_bytes` (answering the request it belonged to
with an error) and, when reading fails, says why and closes the session's stream, so the waiting
call fails at once. Spawning and the spec's shutdown sequence stay the SDK's (private helpers).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import ByteReceiveStream
from mcp.client.stdio import _create_platform_compatible_process, _drain_stdout, _parse_line, _stop_server_process
from mcp.shared.message import SessionMessage
from mcp.types import INTERNAL_ERROR, ErrorData, JSONRPCError, JSONRPCRequest, JSONRPCResponse

from art_agents.integrations.mcp_tools import describe

EDGE_BYTES = 512  # of an oversized line, the start and end kept to find its request id
WRITER_FLUSH_S = 0.5  # for accepted messages to reach the server before its stdin closes
_ID = re.compile(rb'(?<!\\)"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')


@dataclass
class StdioState:
    """What the session reads back from its transport: the process, and why reading stopped, if it broke."""

    process: Any = None
    failure: str | None = None
    pending: set[int | str] = field(default_factory=set)


@asynccontextmanager
async def stdio_transport(
    argv: list[str], env: dict[str, str], cwd: str | None, errlog: Any, max_line_bytes: int, state: StdioState
) -> AsyncIterator[tuple[Any, Any]]:
    """Spawn `argv` and yield the (read, write) streams an `mcp.Client` takes; stops the server on exit."""
    process = await _create_platform_compatible_process(argv[0], argv[1:], env=env, errlog=errlog, cwd=cwd)
    state.process = process
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def reader() -> None:
        try:
            async with read_writer:
                async for message in _messages(process.stdout, max_line_bytes, state):
                    await read_writer.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the session is gone or closing
        except Exception as exc:  # any cause: the session must hear of it, not wait on it
            state.failure = f"reading its stdout failed: {describe(exc)}"
        finally:
            await _drain_stdout(process)

    async def writer() -> None:
        try:
            async with write_reader:
                async for session_message in write_reader:
                    message = session_message.message
                    if isinstance(message, JSONRPCRequest):
                        state.pending.add(message.id)
                    line = message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(line.encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # a server that stopped reading: the session sees the end, not a hang
        finally:
            writer_done.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(reader)
        tasks.start_soon(writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):  # the server must stop even when the caller is cancelled
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(WRITER_FLUSH_S):
                    await writer_done.wait()
                await _stop_server_process(process)
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()
                await anyio.lowlevel.checkpoint()
            tasks.cancel_scope.cancel()


async def _messages(
    stdout: ByteReceiveStream, max_line_bytes: int, state: StdioState
) -> AsyncIterator[SessionMessage | Exception]:
    """The server's messages, one per line; an oversized line becomes an error answer to its request."""
    parts: list[bytes] = []
    size = 0
    head = tail = b""
    async for chunk in stdout:
        start = 0
        while start <= len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end == -1 else chunk[start:end]
            size += len(piece)
            if size <= max_line_bytes:
                parts.append(piece)
            elif not head:  # just went over: keep only the edges from now on
                joined = b"".join([*parts, piece])
                head, tail, parts = joined[:EDGE_BYTES], joined[-EDGE_BYTES:], []
            else:
                tail = (tail + piece)[-EDGE_BYTES:]
            if end == -1:
                break
            if size <= max_line_bytes:
                if line := b"".join(parts).strip():
                    yield _received(line.decode("utf-8", errors="replace"), state)
            elif (answer := _oversized(head + b"\n" + tail, size, max_line_bytes, state)) is not None:
                yield answer
            parts, size, head, tail, start = [], 0, b"", b"", end + 1


def _received(line: str, state: StdioState) -> SessionMessage | Exception:
    message = _parse_line(line)
    if isinstance(message, SessionMessage) and isinstance(message.message, (JSONRPCResponse, JSONRPCError)):
        state.pending.discard(message.message.id)
    return message


def _oversized(edges: bytes, size: int, limit: int, state: StdioState) -> SessionMessage | None:
    """An error answer to the pending request whose id the line's edges show; None when none does."""
    for match in _ID.finditer(edges):
        request_id = json.loads(match.group(1))
        if request_id in state.pending:
            state.pending.discard(request_id)
            error = ErrorData(
                code=INTERNAL_ERROR,
                message=(
                    f"its answer was {size / 1e6:.1f} MB, over max_message_bytes={limit}, and was discarded; "
                    "ask the tool for less, or raise MCPServer(max_message_bytes=...)"
                ),
            )
            return SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
    return None

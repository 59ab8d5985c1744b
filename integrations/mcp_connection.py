"""The connection under an `MCPSession`: an owner task holding the `mcp.Client` over the stdio process or the
HTTP client, and the words for a server that fails to start or goes away.

The client lives in an owner task of its own: anyio cancel scopes must be entered and exited by the
same task, and a transport that fails then takes down only that task, never the rollout using the
session. Closing always stops the server process, also when the rollout is cancelled. A parent killed
with SIGKILL leaves no orphan: stdio servers exit when their stdin closes (checked by the tests for
SDK-based servers). Over stdio the line reader is our own (`mcp_stdio`): it survives invalid UTF-8 and
huge answers, which the SDK's does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import shlex
import tempfile
from collections.abc import Awaitable, Callable
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

from art_agents.errors import ArtError, SetupError
from art_agents.integrations.mcp_tools import describe, is_network_error, leaf_error

if TYPE_CHECKING:
    from mcp import Client

    from art_agents.integrations.mcp_stdio import StdioState

STDERR_TAIL_BYTES = 1500
STDERR_TAIL_LINES = 12
EXIT_WAIT_POLLS = 100  # 1 s for a server that closed its stdout to be reaped, so errors can say its exit code
_owners: set[asyncio.Task[None]] = set()  # strong references: a closing owner must not be garbage collected


class MCPError(ArtError):
    """An MCP server cannot be started or reached, or went away; the message names the fix."""


class MCPUnreachable(MCPError, SetupError):
    """The server's command is missing or not executable, or its URL refuses: every rollout would hit it, so a
    gather stops at once instead of counting it."""


class MCPSchemaError(MCPError):
    """A tool's inputSchema is not valid JSON Schema, so no model can be given that tool."""


class Endpoint(Protocol):
    """What a connection reads of its `MCPServer`, which satisfies it (a Protocol keeps this module below mcp.py)."""

    command: list[str] | None
    url: str | None
    headers: dict[str, str]
    env: dict[str, str] | None
    cwd: str | None
    name: str | None
    tool_timeout_s: float
    connect_timeout_s: float
    max_message_bytes: int
    protocol: Literal["legacy", "auto"]

    @property
    def label(self) -> str: ...


class MCPConnection:
    """One started server (or HTTP session) and its client, owned by a task of its own until `aclose()`.

    `on_connect(client)` runs in the owner task once the client is initialized (the session lists its
    tools there); what it raises fails the start like any other error.
    """

    def __init__(self, server: Endpoint, on_connect: Callable[[Client], Awaitable[None]]) -> None:
        self.server = server
        self.server_name: str = server.label
        self.client: Client | None = None
        self._on_connect = on_connect
        self._pipe: StdioState | None = None
        self._stderr: IO[bytes] | None = None
        self._failure: Exception | None = None
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Start the server (or connect) and initialize, within `connect_timeout_s`; else close and raise MCPError."""
        server = self.server
        # an empty context: the owner outlives the rollout that opened it and must not carry its trajectory
        task = asyncio.create_task(self._own(), name=f"mcp:{server.label}", context=contextvars.Context())
        self._task = task
        _owners.add(task)
        task.add_done_callback(_owners.discard)
        try:
            await asyncio.wait_for(self._ready.wait(), server.connect_timeout_s)
        except TimeoutError:
            await self.aclose()
            raise MCPError(
                f"MCP server '{server.label}' did not finish starting within connect_timeout_s="
                f"{server.connect_timeout_s:g}s{self.stderr_tail()}; raise connect_timeout_s if it is slow to start "
                "(a first `uvx`/`npx` run downloads packages), or check that it speaks MCP on stdout"
            ) from None
        except BaseException:
            await self.aclose()
            raise
        if self._failure is not None:
            error = self._open_error(self._failure)
            await self.aclose()
            raise error from None

    @property
    def process(self) -> Any:
        """The stdio server's process (None over HTTP)."""
        return self._pipe.process if self._pipe is not None else None

    @property
    def closed(self) -> bool:
        return self._task is None or self._task.done()

    async def aclose(self) -> None:
        """Close the connection and stop the server; safe twice, and from a cancelled task."""
        self._closing.set()
        if self._task is not None:
            if not self._ready.is_set():  # abandoned while opening: no polite shutdown for a server that never answered
                if self.process is not None and self.process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        self.process.terminate()
                self._task.cancel()
            await asyncio.wait({self._task})  # if this wait is cancelled, the owner still finishes closing
        if self._stderr is not None:
            self._stderr.close()

    async def _own(self) -> None:
        from mcp import Client
        from mcp.types import Implementation

        try:
            async with contextlib.AsyncExitStack() as stack:
                client = Client(
                    await self._transport(stack),
                    mode=self.server.protocol,
                    read_timeout_seconds=self.server.connect_timeout_s,
                    client_info=Implementation(name="art-agents", version="0"),
                    cache=None,
                )
                await stack.enter_async_context(client)
                self.client = client
                info = client.server_info
                self.server_name = self.server.name or (info.name if info and info.name else self.server.label)
                await self._on_connect(client)
                self._ready.set()
                await self._closing.wait()
        except Exception as exc:
            self._failure = exc
        finally:
            self.client = None
            self._ready.set()

    async def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        if self.server.url is not None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            timeout = httpx2.Timeout(self.server.connect_timeout_s, read=max(300.0, self.server.tool_timeout_s))
            http = await stack.enter_async_context(httpx2.AsyncClient(headers=self.server.headers, timeout=timeout))
            return streamable_http_client(self.server.url, http_client=http)
        from art_agents.integrations.mcp_stdio import StdioState, stdio_transport

        assert self.server.command is not None
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the session; aclose closes it)
        self._pipe = StdioState()
        env = {**os.environ, **(self.server.env or {})}
        return stdio_transport(
            self.server.command, env, self.server.cwd, self._stderr, self.server.max_message_bytes, self._pipe
        )

    def where(self) -> str:
        return self.server.url or f"`{shlex.join(self.server.command or [])}`"

    def exit_code(self) -> int | None:
        return getattr(self.process, "returncode", None)

    def stderr_tail(self) -> str:
        if self._stderr is None or self._stderr.closed:
            return ""
        size = os.fstat(self._stderr.fileno()).st_size
        tail = os.pread(self._stderr.fileno(), STDERR_TAIL_BYTES, max(0, size - STDERR_TAIL_BYTES))
        text = "\n".join(tail.decode(errors="replace").strip().splitlines()[-STDERR_TAIL_LINES:])
        return f"; its stderr ends with:\n{text}\n" if text else ""

    async def gone(self, detail: str | None = None) -> MCPError:
        """The error for a server that went away, with its exit code once the process is reaped."""
        if self._closing.is_set() and self._failure is None:
            return MCPError(
                f"the session to MCP server '{self.server_name}' is closed; call its tools inside "
                "`async with server.session() as session:`"
            )
        for _ in range(EXIT_WAIT_POLLS):
            if self.process is None or self.exit_code() is not None:
                break
            await asyncio.sleep(0.01)
        if self._pipe is not None and self._pipe.failure is not None:
            detail = self._pipe.failure  # the transport's own reason beats the SDK's "Connection closed"
        elif detail is None:
            detail = describe(self._failure) if self._failure is not None else "connection closed"
        if (code := self.exit_code()) is not None:
            detail += f", exit code {code}"
        return MCPError(
            f"MCP server '{self.server_name}' ({self.where()}) exited during the session ({detail})"
            f"{self.stderr_tail()}; its tools are gone for this rollout: check the server's log, then open a new "
            "session"
        )

    def _open_error(self, failure: Exception) -> MCPError:
        from mcp import MCPError as SDKError
        from mcp.types import CONNECTION_CLOSED

        leaf = leaf_error(failure)
        if isinstance(leaf, MCPError):
            return leaf
        label, command = self.server.label, self.server.command
        if command and isinstance(leaf, FileNotFoundError):
            return MCPUnreachable(
                f"MCP server '{label}': command {command[0]!r} not found; install it or check PATH "
                "(or give the full path of the executable)"
            )
        if command and isinstance(leaf, PermissionError):
            return MCPUnreachable(
                f"MCP server '{label}': command {command[0]!r} is not executable; check its path and mode"
            )
        if self.server.url and is_network_error(leaf):
            return MCPUnreachable(
                f"MCP server '{label}': cannot connect to {self.server.url} ({describe(leaf)}); check that the "
                "server is running and that the URL's host, port and path are right"
            )
        if command and isinstance(leaf, SDKError) and leaf.code == CONNECTION_CLOSED:
            code = self.exit_code()
            return MCPError(
                f"MCP server '{label}' exited before it finished starting"
                f"{f' (exit code {code})' if code is not None else ''}{self.stderr_tail()}; "
                f"run {self.where()} by hand to see why"
            )
        return MCPError(f"MCP server '{label}' ({self.where()}) failed to start: {describe(leaf)}{self.stderr_tail()}")

"""MCP tool sessions whose every tool call is recorded in the running rollout (MCP•RL).

`MCPServer` says how to reach a server (a command for stdio, a URL for streamable HTTP);
`server.session()` opens an `MCPSession`, whose tools a model sees as OpenAI function tools and
whose `call_tool` records each call in the current trajectory. The connection under a session
(its owner task, the server process, and the errors when it fails) is `mcp_connection`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from art_agents.capture import current_trajectory, record_tool_call
from art_agents.extras import require_extra
from art_agents.integrations.mcp_connection import MCPConnection, MCPError, MCPSchemaError
from art_agents.integrations.mcp_tools import (
    all_pages,
    as_text,
    call_parts,
    command_label,
    openai_names,
    openai_tool,
    parse_arguments,
    result_text,
    schema_problem,
    truncated,
)
from art_agents.schema import Schema

if TYPE_CHECKING:
    from mcp import Client
    from mcp.types import Tool

TRUNCATED_METRIC = "mcp_truncated_results"  # in trajectory.metrics: tool results cut to max_result_chars


class ToolResult(Schema):
    """What one tool call gave back, as the model will read it."""

    name: str = Field(description="The MCP tool name (not the OpenAI-safe alias).")
    arguments: dict[str, Any] | str = Field(description="As parsed; the original text when it was not a JSON object.")
    content: str = Field(description="Text for the model; starts with 'Error: ' when is_error.")
    is_error: bool = False
    error: str | None = Field(None, description="Why the call failed: tool error, bad arguments, timeout.")
    duration_s: float = 0.0
    structured: Any | None = Field(None, description="The tool's structuredContent, if any.")

    def message(self, tool_call_id: str) -> dict[str, Any]:
        """The OpenAI `tool` message answering the model's call `tool_call_id`."""
        return {"role": "tool", "tool_call_id": tool_call_id, "content": self.content}


class MCPServer(Schema):
    """How to reach one MCP server; `session()` opens a connection."""

    command: list[str] | None = Field(None, description="stdio: argv of the server process.")
    url: str | None = Field(None, description="Streamable HTTP endpoint, e.g. http://127.0.0.1:8000/mcp.")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP headers (auth).")
    env: dict[str, str] | None = Field(None, description="Extra environment of the stdio process, over os.environ.")
    cwd: str | None = None
    name: str | None = Field(None, description="Label; default: derived from the command or the URL host.")
    tool_timeout_s: float = Field(30.0, gt=0, description="Per tool call; past it the call is an error result.")
    connect_timeout_s: float = Field(30.0, gt=0, description="Start + initialize + list tools.")
    max_result_chars: int = Field(
        20_000, gt=0, description="Of a tool result's text, what the model reads; the rest is cut, with a marker."
    )
    max_message_bytes: int = Field(
        64 * 2**20, gt=0, description="stdio: a longer line from the server is discarded; its call gets an error."
    )
    shared: bool = Field(False, description="One session reused by every `session()` call (read-only servers).")
    protocol: Literal["legacy", "auto"] = Field(
        "legacy",
        description=(
            "`legacy`: the initialize handshake, whose HTTP session id lets a stateful server keep state per "
            "session, so fresh sessions stay isolated. `auto`: probe the 2026-07-28 protocol first (no sessions); "
            "needed only for servers that speak nothing older."
        ),
    )

    _shared_session: Any = PrivateAttr(None)
    _shared_lock: Any = PrivateAttr(None)

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (a stdio server's argv) or `url` (a streamable HTTP URL)")
        if self.command is not None and (not self.command or not all(self.command)):
            raise ValueError(
                f"`command` must be a non-empty argv such as ['uvx', 'mcp-server-time'], got {self.command}"
            )
        if self.url is not None and urlsplit(self.url).scheme not in ("http", "https"):
            raise ValueError(f"`url` must start with http:// or https://, got {self.url!r}")
        return self

    @classmethod
    def parse(cls, command: str | list[str] | None = None, *, url: str | None = None, **options: Any) -> MCPServer:
        """From a command line (`"uvx mcp-server-time --x"`, shlex-split), an argv, or a URL."""
        if isinstance(command, str) and urlsplit(command).scheme in ("http", "https") and url is None:
            command, url = None, command
        if isinstance(command, str):
            command = shlex.split(command)
        return cls(command=command, url=url, **options)

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.command:
            return command_label(self.command)
        return urlsplit(self.url or "").hostname or str(self.url)

    def session(self) -> contextlib.AbstractAsyncContextManager[MCPSession]:
        """A fresh session (own process / own HTTP session) per call; with `shared`, one for all."""
        return self._shared_use() if self.shared else self._fresh()

    @contextlib.asynccontextmanager
    async def _fresh(self) -> AsyncIterator[MCPSession]:
        session = await MCPSession.open(self)
        try:
            yield session
        finally:
            await session.aclose()

    @contextlib.asynccontextmanager
    async def _shared_use(self) -> AsyncIterator[MCPSession]:
        if self._shared_lock is None:
            self._shared_lock = asyncio.Lock()
        async with self._shared_lock:
            if self._shared_session is None or self._shared_session.closed:
                self._shared_session = await MCPSession.open(self)
        yield self._shared_session

    async def aclose(self) -> None:
        """Close the shared session, if one is open."""
        session, self._shared_session = self._shared_session, None
        if session is not None:
            await session.aclose()

    async def __aenter__(self) -> MCPServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class MCPSession:
    """One open connection to an MCP server: its tools as OpenAI tools, and recorded tool calls.

    `pid` is the stdio server's process id (None over HTTP), so callers can check the process is
    gone after the session closed.
    """

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.instructions: str | None = None
        self.tools: list[Tool] = []
        self._openai_tools: list[dict[str, Any]] = []
        self._to_openai: dict[str, str] = {}
        self._to_mcp: dict[str, str] = {}
        self._connection = MCPConnection(server, self._on_connect)

    @classmethod
    async def open(cls, server: MCPServer) -> MCPSession:
        """Start the server (or connect), initialize and list its tools, within `connect_timeout_s`."""
        require_extra("mcp", purpose="MCPServer.session()")  # else the import fails unseen, in the owner task
        session = cls(server)
        await session._connection.open()
        return session

    async def _on_connect(self, client: Client) -> None:
        self.instructions = client.instructions
        self._set_tools(await all_pages(client.list_tools, "tools"))

    @property
    def server_name(self) -> str:
        """The server's own name (from its initialize answer) unless the MCPServer names it."""
        return self._connection.server_name

    @property
    def pid(self) -> int | None:
        """The stdio server's process id (None over HTTP)."""
        return getattr(self._connection.process, "pid", None)

    @property
    def closed(self) -> bool:
        return self._connection.closed

    async def aclose(self) -> None:
        """Close the connection and stop the server; safe twice, and from a cancelled task."""
        await self._connection.aclose()

    def _set_tools(self, tools: list[Tool]) -> None:
        for tool in tools:
            if problem := schema_problem(tool.input_schema):
                raise MCPSchemaError(
                    f"MCP server '{self.server_name}': tool {tool.name!r} has an invalid inputSchema: {problem}; "
                    "fix the tool's schema on the server (a model cannot be given a tool it cannot call)"
                )
        self.tools = tools
        self._to_openai = openai_names(tool.name for tool in tools)
        self._to_mcp = {alias: name for name, alias in self._to_openai.items()}
        self._openai_tools = [openai_tool(tool, self._to_openai[tool.name]) for tool in tools]

    async def list_tools(self) -> list[Tool]:
        """List the tools again (a server may change them) and refresh `tools` and the OpenAI names."""
        tools = await self._request(lambda client: all_pages(client.list_tools, "tools"))
        self._set_tools(tools)
        return tools

    async def list_resources(self) -> list[Any]:
        """The server's resources; [] for a server without the capability."""
        return await self._request(lambda client: all_pages(client.list_resources, "resources"), "resources")

    async def list_prompts(self) -> list[Any]:
        """The server's prompts; [] for a server without the capability."""
        return await self._request(lambda client: all_pages(client.list_prompts, "prompts"), "prompts")

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools as OpenAI function tools (a copy: callers may change it)."""
        return copy.deepcopy(self._openai_tools)

    def mcp_name(self, openai_name: str) -> str:
        """The MCP name behind an OpenAI-safe tool name (an MCP name maps to itself)."""
        if openai_name in self._to_mcp:
            return self._to_mcp[openai_name]
        if openai_name in self._to_openai:
            return openai_name
        raise KeyError(f"MCP server '{self.server_name}' has no tool {openai_name!r}; its tools: {self._tool_list()}")

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | str | None = None,
        *,
        tool_call_id: str | None = None,
        timeout_s: float | None = None,
    ) -> ToolResult:
        """Run one tool and record it in the current rollout.

        Whatever the model can recover from (unknown tool, bad arguments, a tool error, a timeout)
        comes back as an error result it can read; a server that is gone raises MCPError.
        """
        started = time.perf_counter()
        parsed, problem = parse_arguments(arguments)
        tool = self._to_mcp.get(name, name if name in self._to_openai else None)
        text, structured = "", None
        if tool is None:
            problem = f"unknown tool {name!r}; available tools: {self._tool_list()}"
        elif problem is None:
            assert parsed is not None
            try:
                text, problem, structured = await self._invoke(tool, parsed, timeout_s or self.server.tool_timeout_s)
            except MCPError as gone:
                self._record(tool, parsed, None, str(gone), started, tool_call_id)
                raise
        else:
            problem = f"tool {tool!r}: {problem}"
        recorded = parsed if parsed is not None else as_text(arguments)
        content, problem = self._for_model(text, problem)
        result = ToolResult(
            name=tool or name,
            arguments=recorded,
            content=content,
            is_error=problem is not None,
            error=problem,
            duration_s=time.perf_counter() - started,
            structured=structured,
        )
        self._record(result.name, recorded, result.content, problem, started, tool_call_id)
        return result

    def _for_model(self, text: str, problem: str | None) -> tuple[str, str | None]:
        """(content, problem) cut to max_result_chars, so no answer floods the context; cuts count in the rollout."""
        limit = self.server.max_result_chars
        if len(problem or text) > limit and (trajectory := current_trajectory()) is not None:
            trajectory.metrics[TRUNCATED_METRIC] = int(trajectory.metrics.get(TRUNCATED_METRIC, 0)) + 1
        if problem is not None:
            problem = truncated(problem, limit)
            return f"Error: {problem}", problem
        return truncated(text, limit), None

    async def run_tool_calls(self, tool_calls: Any) -> list[dict[str, Any]]:
        """Run an assistant message's tool calls in order; returns the OpenAI `tool` messages.

        Calls may be OpenAI SDK objects, `art_agents.messages.ToolCall`s, or dicts.
        """
        messages = []
        for call in tool_calls or []:
            call_id, name, arguments = call_parts(call)
            result = await self.call_tool(name, arguments, tool_call_id=call_id)
            messages.append(result.message(call_id or ""))
        return messages

    async def _invoke(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> tuple[str, str | None, Any]:
        """(text, problem, structured) of one call; raises MCPError when the server is gone."""
        import anyio
        from mcp import MCPError as SDKError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        client = self._connection.client
        if client is None:
            raise await self._connection.gone()
        try:
            result = await client.call_tool(tool, arguments, read_timeout_seconds=timeout_s)
        except SDKError as exc:
            if exc.code == CONNECTION_CLOSED:
                raise await self._connection.gone(exc.message) from None
            if exc.code == REQUEST_TIMEOUT:
                return "", f"tool {tool!r} timed out after {timeout_s:g}s (tool_timeout_s)", None
            return "", f"tool {tool!r} failed: {exc.message}", None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            raise await self._connection.gone(type(exc).__name__) from None
        except (RuntimeError, ValidationError) as exc:  # the server answered something the SDK rejects
            return "", f"tool {tool!r} gave an invalid result: {exc}", None
        text = result_text(result)
        if result.is_error:
            return text, text or f"tool {tool!r} reported an error without a message", None
        return text, None, result.structured_content

    async def _request(
        self, send: Callable[[Client], Awaitable[list[Any]]], capability: str | None = None
    ) -> list[Any]:
        from mcp import MCPError as SDKError
        from mcp.types import CONNECTION_CLOSED, METHOD_NOT_FOUND

        client = self._connection.client
        if client is None:
            raise await self._connection.gone()
        if capability is not None and getattr(client.server_capabilities, capability, None) is None:
            return []
        try:
            return await send(client)
        except SDKError as exc:
            if exc.code == METHOD_NOT_FOUND and capability is not None:
                return []
            if exc.code == CONNECTION_CLOSED:
                raise await self._connection.gone(exc.message) from None
            raise MCPError(f"MCP server '{self.server_name}' refused the request: {exc.message}") from None

    def _record(
        self,
        tool: str,
        arguments: dict[str, Any] | str,
        content: str | None,
        error: str | None,
        started: float,
        call_id: str | None,
    ) -> None:
        record_tool_call(
            tool,
            arguments,
            result=content,
            error=error,
            duration_s=time.perf_counter() - started,
            tool_call_id=call_id,
            span=f"mcp:{self.server_name}/{tool}",
        )

    def _tool_list(self) -> str:
        return ", ".join(self._to_openai) or "(none)"

"""A stateful key-value MCP server for tests: stdio by default, streamable HTTP with `--http PORT`.

State lives per MCP session: keyed by the HTTP session id (one per initialize handshake), and one
store per process over stdio, so fresh sessions are isolated. `slow` sleeps (timeouts), `crash`
ends the process at once (a server dying mid-rollout), and `kv.size` has a name OpenAI rejects.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections import defaultdict

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

INSTRUCTIONS = "A key-value store. Use put to store a value, get to read it back and keys to list the keys."

server = MCPServer("kv", instructions=INSTRUCTIONS, log_level="WARNING")
_stores: defaultdict[str, dict[str, str]] = defaultdict(dict)


def _store(ctx: Context) -> dict[str, str]:
    return _stores[(ctx.headers or {}).get("mcp-session-id", "stdio")]


@server.tool()
def put(key: str, value: str, ctx: Context) -> str:
    """Store a value under a key."""
    _store(ctx)[key] = value
    return f"stored {key}"


@server.tool()
def get(key: str, ctx: Context) -> str:
    """Read the value stored under a key."""
    store = _store(ctx)
    if key not in store:
        raise ToolError(f"no such key: {key}")
    return store[key]


@server.tool()
def keys(ctx: Context) -> list[str]:
    """List the stored keys."""
    return sorted(_store(ctx))


@server.tool(name="kv.size")
def size(ctx: Context) -> int:
    """How many keys are stored."""
    return len(_store(ctx))


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def setting(name: str, ctx: Context) -> str:
    """An HTTP request header, or else an environment variable, of this name (checks what clients pass)."""
    return (ctx.headers or {}).get(name.lower()) or os.environ.get(name, "")


@server.tool()
def crash() -> str:
    """End the server process at once."""
    os._exit(3)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT")
    args = parser.parse_args()
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()

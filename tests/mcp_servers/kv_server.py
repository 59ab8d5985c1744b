"""A stateful key-value MCP server for tests: stdio by default, streamable HTTP with `--http PORT`.

State lives per MCP session (keyed by the session id over HTTP, one store per process over stdio),
so fresh sessions are isolated. `slow` sleeps (timeouts), `crash` kills the process (a server that
dies mid-rollout).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections import defaultdict

from mcp.server.mcpserver import Context, MCPServer

INSTRUCTIONS = "A key-value store. Use put to store a value, get to read it back and keys to list the keys."

server = MCPServer("kv", instructions=INSTRUCTIONS, log_level="WARNING")
_stores: defaultdict[str, dict[str, str]] = defaultdict(dict)


def _store(ctx: Context) -> dict[str, str]:
    headers = ctx.headers or {}
    return _stores[headers.get("mcp-session-id", "stdio")]


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
        raise ValueError(f"no such key: {key}")
    return store[key]


@server.tool()
def keys(ctx: Context) -> list[str]:
    """List the stored keys."""
    return sorted(_store(ctx))


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer (for timeouts)."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def crash() -> str:
    """Exit the process at once (a server dying mid-rollout)."""
    os._exit(3)


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, help="serve streamable HTTP on this loopback port instead of stdio")
    args = parser.parse_args()
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()

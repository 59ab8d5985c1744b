"""An MCP server over stdio with one tool that answers after a given delay: a search API, a database, a
browser, whatever an agent waits on. `benchmarks/async_pipeline.py` rolls out against it."""

from __future__ import annotations

import asyncio

from mcp.server.mcpserver import MCPServer

server = MCPServer("slow-lookup", instructions="Look things up; each lookup takes a while.", log_level="WARNING")


@server.tool()
async def lookup(query: str, delay_s: float) -> str:
    """Look up a query; the answer comes after `delay_s` seconds."""
    await asyncio.sleep(delay_s)
    return f"Notes on {query}: it is spelled {' '.join(query)}."


if __name__ == "__main__":
    server.run()

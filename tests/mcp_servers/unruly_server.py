"""An MCP server whose answers are hard on a client: huge results, and with `--latin1` invalid UTF-8 on stdout.

`--latin1` writes the wire in Latin-1 (a server on a misconfigured locale): `word` then answers
"café" with the byte 0xE9, which is not UTF-8. `big` answers a text of the given size at once.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server

server = MCPServer("unruly", log_level="WARNING")


@server.tool()
def word() -> str:
    """A word with a non-ASCII letter."""
    return "café"


@server.tool()
def big(megabytes: float) -> str:
    """A text of this many megabytes (1,000,000 characters each)."""
    return "x" * int(megabytes * 1_000_000)


@server.tool()
def echo(text: str) -> str:
    """The text back."""
    return text


async def serve_latin1() -> None:
    wire = io.TextIOWrapper(os.fdopen(os.dup(sys.stdout.fileno()), "wb"), encoding="latin-1")
    async with stdio_server(stdout=anyio.wrap_file(wire)) as (read_stream, write_stream):
        lowlevel = server._lowlevel_server
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--latin1", action="store_true", help="write the wire in Latin-1, not UTF-8")
    if parser.parse_args().latin1:
        anyio.run(serve_latin1)
    else:
        server.run()

"""An MCP server (lowlevel API) advertising a tool whose inputSchema is not valid JSON Schema."""

from __future__ import annotations

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

BAD_SCHEMA = {"type": "object", "properties": {"x": {"type": 12}}}


async def list_tools(ctx: object, params: object) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[
            types.Tool(name="fine", description="A valid tool.", input_schema={"type": "object", "properties": {}}),
            types.Tool(name="broken", description="Its schema says type 12.", input_schema=BAD_SCHEMA),
        ]
    )


async def call_tool(ctx: object, params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])


server = Server("bad-schema", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)

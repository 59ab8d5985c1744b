"""Conversions between MCP and OpenAI shapes (tool names, schemas, calls, results) and small helpers.

Kept free of the `mcp` import so the session module stays cheap to import; the MCP objects
handled here are read by attribute.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
MAX_NAME = 64
MAX_PAGES = 100  # a paginator that never ends cannot hang the session
RUNNERS = {"uvx", "npx", "bunx", "pnpx", "pipx"}


def openai_names(names: Iterable[str]) -> dict[str, str]:
    """MCP tool name -> a unique name OpenAI accepts (`^[a-zA-Z0-9_-]{1,64}$`).

    Names that are already safe keep themselves, so another tool's alias never takes them.
    """
    names = list(names)
    mapping = {name: name for name in names if not _UNSAFE.search(name) and 0 < len(name) <= MAX_NAME}
    taken = set(mapping)
    for name in names:
        if name in mapping:
            continue
        base = _UNSAFE.sub("_", name)[:MAX_NAME] or "tool"
        candidate, number = base, 2
        while candidate in taken:
            suffix = f"_{number}"
            candidate, number = base[: MAX_NAME - len(suffix)] + suffix, number + 1
        mapping[name] = candidate
        taken.add(candidate)
    return mapping


def openai_tool(tool: Any, name: str) -> dict[str, Any]:
    """One MCP tool as an OpenAI function tool; the input schema is kept as the server gave it."""
    parameters = copy.deepcopy(dict(tool.input_schema or {}))
    if "type" not in parameters:
        parameters = {"type": "object", "properties": {}, **parameters}
    description = tool.description or tool.title or ""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def schema_problem(schema: Any) -> str | None:
    """Why `schema` is not valid JSON Schema, or None when it is."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    if not isinstance(schema, dict):
        return f"inputSchema is a {type(schema).__name__}, not a JSON object"
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.absolute_path)
        return f"{exc.message}" + (f" (at {where})" if where else "")
    return None


def parse_arguments(arguments: dict[str, Any] | str | None) -> tuple[dict[str, Any] | None, str | None]:
    """Model-written arguments -> (the JSON object, None), or (None, what is wrong with them)."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}, None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return None, f"the arguments are not valid JSON ({exc.msg} at position {exc.pos}); send a JSON object"
    if not isinstance(arguments, dict):
        return None, f"the arguments must be a JSON object, got {type(arguments).__name__}"
    return arguments, None


def call_parts(call: Any) -> tuple[str | None, str, Any]:
    """(id, name, arguments) of an OpenAI SDK tool call, an `art_agents` ToolCall or a dict.

    Dicts may be in the OpenAI shape (`function: {name, arguments}`) or LangChain's (`name`, `args`).
    """
    if isinstance(call, dict):
        function = call.get("function")
        if function is not None:
            return call.get("id"), function["name"], function.get("arguments")
        return call.get("id"), call["name"], call.get("args", call.get("arguments"))
    return call.id, call.function.name, call.function.arguments


def result_text(result: Any) -> str:
    """A CallToolResult as the text a model reads: text joined, binary parts as placeholders.

    With no content but structured content, the structured content's JSON.
    """
    parts = [_part_text(part) for part in result.content or []]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(parts)


def truncated(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, with a marker saying so that the model can read."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[truncated: the first {limit:,} of {len(text):,} characters (max_result_chars)]"


def _part_text(part: Any) -> str:
    kind = getattr(part, "type", None)
    if kind == "text":
        return part.text
    if kind in ("image", "audio"):
        return f"[{kind}: {part.mime_type}, {_decoded_size(part.data)} bytes]"
    if kind == "resource":
        resource = part.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return text
        mime = resource.mime_type or "application/octet-stream"
        return f"[resource: {resource.uri}, {mime}, {_decoded_size(resource.blob)} bytes]"
    if kind == "resource_link":
        return f"[resource link: {part.name} {part.uri}]"
    return f"[{kind} content]"


def _decoded_size(data: str) -> int:
    """Bytes behind a base64 string, without decoding it."""
    data = data.strip()
    return len(data) * 3 // 4 - len(data) + len(data.rstrip("="))


async def all_pages(method: Callable[..., Awaitable[Any]], field: str) -> list[Any]:
    """Every item of a paginated MCP list call."""
    items: list[Any] = []
    cursor = None
    for _ in range(MAX_PAGES):
        page = await method(cursor=cursor)
        items += getattr(page, field)
        cursor = page.next_cursor
        if not cursor:
            break
    return items


def command_label(command: list[str]) -> str:
    """`python -m pkg` -> pkg, `python server.py` -> server, `uvx pkg@1 --x` -> pkg, else the executable."""
    executable, args = Path(command[0]).name, command[1:]
    if executable.startswith("python"):
        if "-m" in args[:-1]:
            return args[args.index("-m") + 1]
        if args and not args[0].startswith("-"):
            return Path(args[0]).stem
    if executable in RUNNERS:
        package = next((a for a in args if not a.startswith("-") and a != "run"), executable)
        return package.rsplit("/", 1)[-1].split("@", 1)[0] or executable
    return executable


def leaf_error(exc: BaseException) -> BaseException:
    """The first real error inside anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = next((e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)), exc.exceptions[0])
    return exc


def describe(exc: BaseException) -> str:
    """The message of the real error, without the exception groups around it."""
    leaf = leaf_error(exc)
    return str(leaf) or type(leaf).__name__


def is_network_error(exc: BaseException) -> bool:
    """A failure to reach an HTTP server (refused, DNS, reset)."""
    import httpx2

    return isinstance(exc, (httpx2.TransportError, OSError))


def as_text(arguments: Any) -> str:
    """Arguments that are not a JSON object, kept as text for the record."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)

"""Anthropic's Messages API as a format over the chat engine call.

A Messages request becomes the chat form the engine plans from (system prompt first, `tool_use` blocks as
`tool_calls`, `tool_result` blocks as `tool` messages, `thinking` blocks as `reasoning_content`), and the chat
result becomes an Anthropic `message` or its stream of events. What would change what is sampled and cannot be
honoured (images, server tools, a forced tool call, `top_k`) is refused by name; `cache_control`, `metadata` and
the like do not change what is sampled and are accepted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from art_agents.server.errors import ServiceError, describe
from art_agents.server.formats.refusals import Refusals, refuse_unless_neutral
from art_agents.server.models.chat_format import hermes_call
from art_agents.server.serving.completions import ChatPlan, Completed, StreamDelta, StreamItem

# Top-level fields that would change what is sampled or its format: refused by name unless neutral.
UNSUPPORTED: Refusals = {
    "top_k": ((None,), "sampling is temperature and top_p only"),
    "output_config": ((None, {}), "output is not constrained to a format or an effort level"),
    "mcp_servers": ((None, []), "this server connects to no MCP servers"),
    "context_management": ((None, {}), "the conversation is sampled as sent"),
}
_THINKING = {"enabled": True, "adaptive": True, "disabled": False}
_MEDIA = ("image", "document")
JOIN = "\n\n"  # between the text blocks of one message or system prompt


class MessagesRequest(BaseModel):
    """The Anthropic Messages fields this server honours; limits match the chat route's (4 stop strings of 256
    characters, 128 tools of 256 KB of schema in all)."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1, max_length=4096)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = Field(None, max_length=4)
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _honourable(self) -> MessagesRequest:
        refuse_unless_neutral(self.model_extra or {}, UNSUPPORTED)
        choice = (self.tool_choice or {}).get("type", "auto")
        if choice not in ("auto", "none"):
            raise ValueError(
                f"tool_choice type {choice!r} is not supported: the server cannot force a tool call; use 'auto'"
            )
        if self.thinking is not None and self.thinking.get("type") not in _THINKING:
            raise ValueError(
                f"thinking type {self.thinking.get('type')!r} is not supported; use one of {list(_THINKING)}"
            )
        if any(len(stop) > 256 for stop in self.stop_sequences or []):
            raise ValueError("stop_sequences are limited to 256 characters each")
        if self.tools and len(json.dumps(self.tools)) > 256 * 1024:
            raise ValueError("tools are limited to 256 KB of JSON schema in all")
        return self


# --- request -> chat form -------------------------------------------------------------------


def chat_body(request: MessagesRequest) -> dict[str, Any]:
    """The chat request `plan_chat` takes; content that cannot be honoured raises `ServiceError(400)`."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request.system, request.messages),
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop": request.stop_sequences,
        "stream": request.stream,
        "tools": [chat_tool(tool, f"tools[{i}]") for i, tool in enumerate(request.tools or [])] or None,
        "tool_choice": (request.tool_choice or {}).get("type"),
    }
    if request.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": _THINKING[request.thinking["type"]]}
    return {key: value for key, value in body.items() if value is not None}


def chat_messages(system: str | list[dict[str, Any]] | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The system prompt, then each message in chat form (a user message may become several)."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": _joined(system, "system", ("text",))})
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        blocks = _blocks(message.get("content"), f"{where}.content")
        role = message.get("role")
        if role == "user":
            out += _user(blocks, where)
        elif role == "assistant":
            out.append(_assistant(blocks, where))
        else:
            raise ServiceError(400, f"{where}.role={role!r}: use 'user' or 'assistant' (the system prompt is `system`)")
    if out[-1]["role"] == "assistant":
        raise ServiceError(
            400,
            f"messages[{len(messages) - 1}] is an assistant message (a prefill): this server answers in a new turn "
            "and cannot continue a partial reply; end with a user message",
        )
    return out


def chat_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """An Anthropic client tool as a chat function tool; server tools (a `type` of their own) are refused."""
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise ServiceError(
            400,
            f"{where} has type {kind!r}: Anthropic server tools are not supported (this server runs no tools); "
            "declare a client tool with name, description and input_schema",
        )
    if not isinstance(tool.get("name"), str):
        raise ServiceError(400, f"{where}.name is required")
    if tool.get("strict"):
        raise ServiceError(400, f"{where}.strict=true is not supported (tool inputs are not constrained); leave it out")
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """Content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(block, dict) for block in content):
        raise ServiceError(400, f"{where} must be a string or a list of content blocks")
    return content


def _check(block: dict[str, Any], where: str, allowed: tuple[str, ...]) -> str:
    """The block's type, refused by name unless allowed here."""
    kind = block.get("type")
    if kind in _MEDIA:
        raise ServiceError(400, f"{where}: {kind} blocks are not supported: this server serves text-only models")
    if kind not in allowed:
        raise ServiceError(400, f"{where}: block type {kind!r} is not supported here; use {', '.join(allowed)}")
    return kind


def _joined(content: Any, where: str, allowed: tuple[str, ...]) -> str:
    """The text of `content` (a string or blocks of the `allowed` types)."""
    blocks = _blocks(content, where)
    for index, block in enumerate(blocks):
        _check(block, f"{where}[{index}]", allowed)
    return JOIN.join(str(block.get("text", "")) for block in blocks if block.get("type") == "text")


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """`tool` messages for the tool results, then the user's text (if any)."""
    kinds = [_check(block, f"{where}.content[{i}]", ("text", "tool_result")) for i, block in enumerate(blocks)]
    results = [_tool_message(block, f"{where}.content[{i}]") for i, block in enumerate(blocks) if kinds[i] != "text"]
    texts = [str(block.get("text", "")) for block in blocks if block.get("type") == "text"]
    if texts or not results:  # an empty message stays one, as sent
        results.append({"role": "user", "content": JOIN.join(texts)})
    return results


def _tool_message(block: dict[str, Any], where: str) -> dict[str, Any]:
    text = _joined(block.get("content") or "", f"{where}.content", ("text",))
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": text}


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    allowed = ("text", "tool_use", "thinking")
    kinds = [_check(block, f"{where}.content[{i}]", allowed) for i, block in enumerate(blocks)]
    texts = [str(block.get("text", "")) for block, kind in zip(blocks, kinds, strict=True) if kind == "text"]
    message: dict[str, Any] = {"role": "assistant", "content": JOIN.join(texts) or None}
    calls = [_tool_call(block) for block, kind in zip(blocks, kinds, strict=True) if kind == "tool_use"]
    if calls:
        message["tool_calls"] = calls
    thoughts = [str(block.get("thinking", "")) for block, kind in zip(blocks, kinds, strict=True) if kind == "thinking"]
    if any(thoughts):
        message["reasoning_content"] = JOIN.join(thoughts)
    return message


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    arguments = json.dumps(block.get("input") or {})
    function = {"name": str(block.get("name", "")), "arguments": arguments}
    return {"id": str(block.get("id", "")), "type": "function", "function": function}


# --- chat result -> message -----------------------------------------------------------------


def message_of(plan: ChatPlan, completed: Completed) -> dict[str, Any]:
    """The Anthropic `message` for the chat result; its id is the token-store key (see `ChatPlan.keyed`), also
    given as `completion_id`, the name the chat protocol's clients look for."""
    response, samples = completed
    choice, usage = response["choices"][0], response["usage"]
    content = content_blocks(choice["message"])
    stop = _stop_sequence(plan, samples[0].token_ids, samples[0].text) if choice["finish_reason"] == "stop" else None
    return {
        **_head(plan),
        "model": response["model"],
        "content": content,
        "stop_reason": _stop_reason(choice["finish_reason"], content, stop),
        "stop_sequence": stop,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]},
    }


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Thinking, text, then tool uses; a call whose arguments are not a JSON object stays text (as hermes)."""
    thinking = message.get("reasoning_content")
    blocks = [{"type": "thinking", "thinking": thinking, "signature": ""}] if thinking else []
    text, uses = message.get("content") or "", []
    for call in message.get("tool_calls") or []:
        use = _tool_use(call)
        if use is None:
            text += hermes_call(call)
        else:
            uses.append(use)
    if text or not (blocks or uses):
        blocks.append({"type": "text", "text": text})
    return blocks + uses


def _tool_use(call: dict[str, Any]) -> dict[str, Any] | None:
    arguments = call["function"].get("arguments")
    try:
        given = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return None
    if not isinstance(given, dict):
        return None
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": given}


def _stop_sequence(plan: ChatPlan, token_ids: list[int], text: str) -> str | None:
    """The stop sequence that cut the reply: the earliest one in the sampled tokens that the cut text lacks."""
    if not plan.params.stop:
        return None
    sampled = plan.served.engine.tokenizer.decode(token_ids, skip_special_tokens=True)
    found = [(sampled.index(s), s) for s in plan.params.stop if s and s in sampled and s not in text]
    return min(found)[1] if found else None


def _stop_reason(finish_reason: str, content: list[dict[str, Any]], stop: str | None) -> str:
    if any(block["type"] == "tool_use" for block in content):
        return "tool_use"
    if stop is not None:
        return "stop_sequence"
    return "max_tokens" if finish_reason == "length" else "end_turn"


def _head(plan: ChatPlan) -> dict[str, Any]:
    """The message before any content: what `message_start` carries."""
    return {
        "id": plan.completion_id,
        "type": "message",
        "role": "assistant",
        "model": plan.served_as,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": len(plan.prompt_ids), "output_tokens": 0},
        "completion_id": plan.completion_id,
    }


# --- stream ---------------------------------------------------------------------------------

_EMPTY = {"text": {"text": ""}, "thinking": {"thinking": "", "signature": ""}, "tool_use": {"input": {}}}


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"


def _delta(index: int, delta: dict[str, Any]) -> str:
    return _event("content_block_delta", {"index": index, "delta": delta})


def _rest(block: dict[str, Any], sent: str) -> dict[str, Any] | None:
    """The delta that completes `block`, `sent` of its text being out already; None when nothing is left."""
    if block["type"] == "text":
        rest = block["text"][len(sent) :]
        return {"type": "text_delta", "text": rest} if rest else None
    if block["type"] == "thinking":
        return {"type": "thinking_delta", "thinking": block["thinking"]}
    return {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}


def _block_events(index: int, block: dict[str, Any], sent: str | None) -> Iterator[str]:
    """A content block's events; `sent` is the text already streamed into an open block (None: not opened)."""
    if sent is None:
        yield _event("content_block_start", {"index": index, "content_block": {**block, **_EMPTY[block["type"]]}})
    if (delta := _rest(block, sent or "")) is not None:
        yield _delta(index, delta)
    yield _event("content_block_stop", {"index": index})


async def message_events(plan: ChatPlan, first: StreamItem, items: AsyncIterator[StreamItem]) -> AsyncIterator[str]:
    """Anthropic's server-sent events: text as it is sampled (in the first block), then the blocks known only at
    the end (thinking and tool uses are parsed from the whole reply), the stop reason and usage."""
    yield _event("message_start", {"message": _head(plan)})
    sent: str | None = None
    item = first
    try:
        while isinstance(item, StreamDelta):
            if sent is None:
                yield _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
                sent = ""
            yield _delta(0, {"type": "text_delta", "text": item.text})
            sent += item.text
            item = await anext(items)
        message = message_of(plan, item)
    except Exception as exc:  # generation failed after the 200 went out: say so in the stream
        yield _event("error", {"error": {"type": "api_error", "message": describe(exc)}})
        return
    for index, block in enumerate(message["content"]):
        for event in _block_events(index, block, sent if index == 0 else None):
            yield event
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield _event("message_delta", {"delta": stop, "usage": message["usage"]})
    yield _event("message_stop", {})

"""The OpenAI Responses API (`POST /v1/responses`) as a format over the chat engine call.

A request becomes a chat body (`instructions` a leading system message, input items chat messages, flat function
tools chat tools, `max_output_tokens` `max_tokens`); the engine's chat completion becomes a `response` object
(reasoning, message and function_call output items) or its stream of events, ending in `response.completed`, or
`response.incomplete` for a reply cut by `max_output_tokens`, as OpenAI's does. The response id is the token-store
key (also given as `completion_id`). Fields that would change what is sampled and that the server cannot honour are
refused by name unless given their neutral value. Two differences from OpenAI, both as in Chat Completions: a
function tool's `strict` is accepted but not enforced (arguments come back as the model wrote them), and
`usage.output_tokens_details.reasoning_tokens` is not counted separately (0).

`previous_response_id` continues a conversation the server still holds in memory (`Conversations`): recent
responses' messages in chat form, bounded, lost on restart, kept unless `store` is false.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from art_agents.server.errors import ServiceError, describe
from art_agents.server.formats.chat import UNSUPPORTED
from art_agents.server.formats.refusals import Refusals, refuse_forced_tool, refuse_unless_neutral
from art_agents.server.serving.completions import StreamDelta, StreamItem

LOGPROBS = "message.output_text.logprobs"

# Responses fields refused by name unless given their neutral value (None is neutral for all), on top of the
# sampling fields the chat route refuses. A field in neither table nor HARMLESS is refused as unknown.
REFUSED: Refusals = {
    **UNSUPPORTED,
    "background": ((False,), "a response is generated while its request waits"),
    "background_options": (({},), "a response is generated while its request waits"),
    "conversation": ((), "conversations are not stored; use previous_response_id or send the whole input"),
    "context_management": (([],), "the input is sent to the model as it is"),
    "prompt": ((), "stored prompt templates are not supported; send instructions and input"),
    "max_tool_calls": ((), "the number of tool calls cannot be capped"),
    "truncation": (("disabled",), "the input is never truncated; one that does not fit is refused"),
}
# Fields that change nothing that is sampled (caching hints, scheduling, abuse ids, stream obfuscation): accepted.
HARMLESS = frozenset(
    {"service_tier", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options"}
    | {"stream_options"}
)


class ResponsesRequest(BaseModel):
    """The Responses fields this server honours; the ones it cannot are refused by name."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_output_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    previous_response_id: str | None = None
    include: list[str] | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None

    @model_validator(mode="after")
    def _honourable(self) -> ResponsesRequest:
        refuse_unless_neutral(
            self.model_extra or {},
            REFUSED,
            unknown="it is not a Responses API field this server knows",
            accepted=HARMLESS,
        )
        refuse_forced_tool(self.tool_choice)
        for value in self.include or []:
            if value != LOGPROBS:
                raise ValueError(
                    f"include={value!r} is not supported by this server; only {LOGPROBS!r} is (reasoning comes back "
                    "as text in reasoning items)"
                )
        _check_text(self.text or {})
        _check_reasoning(self.reasoning or {})
        for index, tool in enumerate(self.tools or []):
            _check_tool(index, tool)
        return self


def _check_text(text: dict[str, Any]) -> None:
    unknown = set(text) - {"format", "verbosity"}
    if unknown:
        raise ValueError(f"text.{sorted(unknown)[0]} is not supported by this server; leave it out")
    form = text.get("format") or {"type": "text"}
    kind = form.get("type") if isinstance(form, dict) else form
    if kind != "text":
        raise ValueError(
            f"text.format type={kind!r} is not supported: output is not constrained to a format; ask for JSON in the "
            "prompt"
        )
    if text.get("verbosity") not in (None, "medium"):
        raise ValueError(f"text.verbosity={text['verbosity']!r} is not supported; leave it out")


def _check_reasoning(reasoning: dict[str, Any]) -> None:
    if reasoning.get("effort") is not None:
        raise ValueError(
            f"reasoning.effort={reasoning['effort']!r} is not supported: whether and how long the model reasons is its "
            "chat template's choice; leave it out"
        )


def _check_tool(index: int, tool: dict[str, Any]) -> None:
    if tool.get("type") != "function":
        raise ValueError(
            f"tools[{index}].type={tool.get('type')!r} is not supported: only function tools are (built-in tools such "
            "as web_search and file_search run on OpenAI's servers)"
        )
    if not isinstance(tool.get("name"), str):
        raise ValueError(f"tools[{index}].name is required: a function tool needs a name")


# --- request -> chat ------------------------------------------------------------------------------------------


def chat_body(request: ResponsesRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat request the engine plans from: `messages` (the conversation so far) after the instructions."""
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    body = {
        "model": request.model,
        "messages": [*system, *messages],
        "tools": [_chat_tool(tool) for tool in request.tools] if request.tools else None,
        "tool_choice": request.tool_choice,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "max_tokens": request.max_output_tokens,
        "stream": request.stream,
    }
    return {key: value for key, value in body.items() if value is not None}


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as chat messages: a reasoning item, an assistant message and function calls that follow one
    another are one assistant message; a function call's output is a tool message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        kind = item.get("type", "message")
        where = f"input[{index}]"
        if kind == "message":
            _add_message(messages, item, where)
        elif kind == "function_call":
            _assistant(messages, for_call=True).setdefault("tool_calls", []).append(_tool_call(item, where))
        elif kind == "function_call_output":
            output = _text(_field(item, "output", where, (str, list)), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": _field(item, "call_id", where), "content": output})
        elif kind == "reasoning":
            messages.append({"role": "assistant", "content": None, "reasoning_content": _reasoning(item)})
        else:
            raise ServiceError(
                400,
                f"{where}.type={kind!r} is not supported: input items are messages, function_call, "
                "function_call_output and reasoning",
            )
    return messages


def _add_message(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise ServiceError(400, f"{where}.role={role!r} is not supported: use user, system, developer or assistant")
    content = _text(_field(item, "content", where, (str, list)), f"{where}.content")
    if role == "assistant":
        _assistant(messages, for_call=False)["content"] = content
    else:  # a developer message is the system prompt of a chat template
        messages.append({"role": "system" if role == "developer" else role, "content": content})


def _assistant(messages: list[dict[str, Any]], *, for_call: bool) -> dict[str, Any]:
    """The assistant message this part joins: the last one if it can still take it, else a new one."""
    last = messages[-1] if messages else {}
    open_for_text = last.get("content") is None and not last.get("tool_calls")
    if last.get("role") == "assistant" and (for_call or open_for_text):
        return last
    messages.append({"role": "assistant", "content": None})
    return messages[-1]


def _tool_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    function = {"name": _field(item, "name", where), "arguments": _field(item, "arguments", where)}
    return {"id": _field(item, "call_id", where), "type": "function", "function": function}


def _field(item: dict[str, Any], key: str, where: str, kind: type | tuple[type, ...] = str) -> Any:
    value = item.get(key)
    if not isinstance(value, kind):
        raise ServiceError(400, f"{where}.{key} is missing or of the wrong type (got {value!r})")
    return value


def _text(content: str | list[Any], where: str) -> str:
    """Text parts joined by newlines (as vLLM joins them); any other part is refused by name."""
    if isinstance(content, str):
        return content
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise ServiceError(400, f"{where}[{index}].type={kind!r} is not supported: this server takes text only")
    return "\n".join(texts)


def _reasoning(item: dict[str, Any]) -> str:
    """The reasoning text, else its summary (what a client that got only a summary can send back)."""
    parts = item.get("content") or item.get("summary") or []
    return "\n".join(part.get("text", "") for part in parts if isinstance(part, dict))


# --- chat -> response -----------------------------------------------------------------------------------------


def to_response(request: ResponsesRequest, chat: dict[str, Any]) -> dict[str, Any]:
    """The Responses `response` for the engine's chat completion (planned `keyed("resp_")`); `completion_id`,
    the token-store key, is its id."""
    choice = chat["choices"][0]
    incomplete = choice["finish_reason"] == "length"
    logprobs = choice["logprobs"]["content"] if LOGPROBS in (request.include or []) else []
    rid = chat["id"]
    usage = chat["usage"]
    return {
        **skeleton(request, rid, chat["model"], "incomplete" if incomplete else "completed"),
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output_items(rid, choice["message"], logprobs, "incomplete" if incomplete else "completed"),
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
        "completion_id": chat["id"],
    }


def skeleton(request: ResponsesRequest, rid: str, model: str, status: str) -> dict[str, Any]:
    """A response without output: what a stream announces first, and the frame of the final one."""
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "reasoning": {"effort": None, "summary": (request.reasoning or {}).get("summary")},
        "store": request.store is not False,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": request.tool_choice or "auto",
        "tools": request.tools or [],
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": request.user,
        "metadata": request.metadata or {},
    }


def output_items(
    rid: str, message: dict[str, Any], logprobs: list[dict[str, Any]], status: str
) -> list[dict[str, Any]]:
    """Reasoning, then the text (always, unless the reply is only tool calls), then one item per tool call."""
    items = []
    if message.get("reasoning_content"):
        part = {"type": "reasoning_text", "text": message["reasoning_content"]}
        items.append(
            {"type": "reasoning", "id": item_id("rs", rid), "summary": [], "content": [part], "status": status}
        )
    if message.get("content") or not message.get("tool_calls"):
        part = {"type": "output_text", "text": message.get("content") or "", "annotations": [], "logprobs": logprobs}
        message_item = {"type": "message", "id": item_id("msg", rid), "role": "assistant", "status": status}
        items.append({**message_item, "content": [part]})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        items.append(
            {
                "type": "function_call",
                "id": item_id("fc", rid, index),
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
                "status": "completed",
            }
        )
    return items


def item_id(prefix: str, rid: str, index: int | None = None) -> str:
    """An output item's id, from its response's id."""
    key = f"{prefix}_{rid.removeprefix('resp_')}"
    return key if index is None else f"{key}_{index}"


# --- streaming ------------------------------------------------------------------------------------------------

Event = tuple[str, dict[str, Any]]  # an event's type and its fields


class _Numbered:
    """Server-sent events numbered in order, as the Responses stream has them (no `[DONE]` at the end)."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def __call__(self, kind: str, fields: dict[str, Any]) -> str:
        data = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"


async def stream_events(
    request: ResponsesRequest,
    first: StreamItem,
    items: AsyncIterator[StreamItem],
    finish: Callable[[dict[str, Any]], dict[str, Any]],
) -> AsyncIterator[str]:
    """Responses events: the text as it is sampled, then every output item, then `response.completed` (or
    `response.incomplete`); an `error` event if generation fails after the 200. `finish` turns the chat completion
    into the final response."""
    sse = _Numbered()
    rid, model = (first.completion_id, first.model) if isinstance(first, StreamDelta) else _head(first[0])
    frame = skeleton(request, rid, model, "in_progress")
    yield sse("response.created", {"response": frame})
    yield sse("response.in_progress", {"response": frame})
    sent: str | None = None  # the message text streamed so far, once its item is open
    item = first
    try:
        while isinstance(item, StreamDelta):
            if sent is None:
                sent = ""
                for event in _open_message(item_id("msg", rid), 0):
                    yield sse(*event)
            yield sse(*_text_delta(item_id("msg", rid), 0, item.text))
            sent += item.text
            item = await anext(items)
    except Exception as exc:  # generation failed after the 200 went out: say so in the stream
        yield sse("error", {"code": "server_error", "message": describe(exc), "param": None})
        return
    response = finish(item[0])
    for index, output in enumerate(response["output"]):
        for event in _item_events(index, output, sent if output["type"] == "message" else None):
            yield sse(*event)
    yield sse(f"response.{response['status']}", {"response": response})


def _head(chat: dict[str, Any]) -> tuple[str, str]:
    return chat["id"], chat["model"]


def _open_message(message_id: str, index: int) -> list[Event]:
    item = {"type": "message", "id": message_id, "role": "assistant", "status": "in_progress", "content": []}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    where = {"item_id": message_id, "output_index": index, "content_index": 0}
    return [
        ("response.output_item.added", {"output_index": index, "item": item}),
        ("response.content_part.added", {**where, "part": part}),
    ]


def _text_delta(message_id: str, index: int, text: str) -> Event:
    where = {"item_id": message_id, "output_index": index, "content_index": 0}
    return "response.output_text.delta", {**where, "delta": text, "logprobs": []}


def _item_events(index: int, item: dict[str, Any], sent: str | None) -> list[Event]:
    """The events of one finished output item; `sent`: the text already streamed for an open message."""
    if item["type"] == "message":
        return _message_events(index, item, sent)
    if item["type"] == "reasoning":
        text, where = item["content"][0]["text"], {"item_id": item["id"], "output_index": index, "content_index": 0}
        middle = [
            ("response.reasoning_text.delta", {**where, "delta": text}),
            ("response.reasoning_text.done", {**where, "text": text}),
        ]
    else:
        where = {"item_id": item["id"], "output_index": index}
        middle = [
            ("response.function_call_arguments.delta", {**where, "delta": item["arguments"]}),
            ("response.function_call_arguments.done", {**where, "name": item["name"], "arguments": item["arguments"]}),
        ]
    empty = {"reasoning": {"content": []}, "function_call": {"arguments": ""}}[item["type"]]
    return [
        ("response.output_item.added", {"output_index": index, "item": {**item, **empty, "status": "in_progress"}}),
        *middle,
        ("response.output_item.done", {"output_index": index, "item": item}),
    ]


def _message_events(index: int, item: dict[str, Any], sent: str | None) -> list[Event]:
    part = item["content"][0]
    events = _open_message(item["id"], index) if sent is None else []
    rest = part["text"][len(sent or "") :]
    if rest:
        events.append(_text_delta(item["id"], index, rest))
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        *events,
        ("response.output_text.done", {**where, "text": part["text"], "logprobs": part["logprobs"]}),
        ("response.content_part.done", {**where, "part": part}),
        ("response.output_item.done", {"output_index": index, "item": item}),
    ]

"""Chat messages to prompt token ids, and generated text back to an OpenAI assistant message.

Prompts go through the model's own chat template. Replies are parsed in the model's own format: the
tokenizer's response parser (transformers 5 `parse_response` on the sampled token ids, after the prompt's,
attached by TRL for the families it knows: Qwen 2.5/3, Llama 3.1/3.2, GPT-OSS, Gemma 4, ...), which also
takes reasoning out into `reasoning_content`; else Mistral's `[TOOL_CALLS][...]` or the common hermes
`<tool_call>{json}</tool_call>` format. Text that looks like a tool call but does not parse stays plain
content: a bad generation is data for training, never a server error.

Many chat templates (SmolLM2's, say) ignore `tools`, drop an assistant message's `tool_calls` or
skip `tool` messages, so a model would never see the tools it is offered, its own calls or their
results. What a template cannot render is rendered in the hermes format it is parsed in: the tools
listed in the system message, calls as `<tool_call>` text, results as `<tool_response>` user turns.
What the template supports is probed once per tokenizer.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_PROBE = "art_probe_7f3a"
HERMES_TOOLS = (
    "You can call these tools:\n<tools>\n{tools}\n</tools>\nTo call a tool, write "
    '<tool_call>{{"name": "TOOL_NAME", "arguments": {{...}}}}</tool_call>; its result comes back in '
    "<tool_response></tool_response>."
)


@dataclass(frozen=True)
class ToolSupport:
    """Which tool parts the chat template renders itself; `raw_arguments`: it writes a call's arguments given as the
    JSON string the model wrote as they are (else they are handed to it as a mapping, which Gemma 4's requires and
    Llama 3's would otherwise encode twice)."""

    tools: bool
    calls: bool
    results: bool
    raw_arguments: bool = True


def tool_support(tokenizer: Any) -> ToolSupport:
    cached = getattr(tokenizer, "_art_tool_support", None)
    if isinstance(cached, ToolSupport):
        return cached
    user = {"role": "user", "content": "hi"}
    raw = '{"probe": 1}'

    def calling(arguments: Any) -> dict[str, Any]:  # the id is 9 letters and digits, as Mistral's template demands
        call = {"id": "probe0001", "type": "function", "function": {"name": f"{_PROBE}_call", "arguments": arguments}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    tool = {"type": "function", "function": {"name": f"{_PROBE}_tool", "description": "", "parameters": {}}}

    def renders(messages: list[dict[str, Any]], needle: str, tools: list[dict[str, Any]] | None = None) -> bool:
        try:
            text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=False)
        except Exception:  # a template that rejects the shape does not support it
            return False
        return needle in str(text)

    raw_arguments = renders([user, calling(raw)], raw)
    arguments = raw if raw_arguments else {"probe": 1}
    result = {"role": "tool", "tool_call_id": "probe0001", "content": f"{_PROBE}_result"}
    support = ToolSupport(
        tools=renders([user], f"{_PROBE}_tool", [tool]),
        calls=renders([user, calling(arguments)], f"{_PROBE}_call"),
        results=renders([user, calling(arguments), result], f"{_PROBE}_result"),
        raw_arguments=raw_arguments,
    )
    tokenizer._art_tool_support = support
    return support


def hermes_call(call: dict[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):  # else rendered as the string the model wrote
            arguments = json.loads(arguments)
    return f"<tool_call>{json.dumps({'name': function.get('name', ''), 'arguments': arguments})}</tool_call>"


def _fallbacks(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, support: ToolSupport
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages and tools with what the template cannot render rewritten in the hermes format."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls") and support.calls and not support.raw_arguments:
            message = {**message, "tool_calls": [_with_mapping_arguments(c) for c in message["tool_calls"]]}
        elif message["role"] == "assistant" and message.get("tool_calls") and not support.calls:
            calls = "\n".join(hermes_call(c) for c in message["tool_calls"])
            text = message.get("content") or ""
            message = {"role": "assistant", "content": f"{text}\n{calls}" if text else calls}
        elif message["role"] == "tool" and not support.results:
            message = {"role": "user", "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"}
        out.append(message)
    if not tools or support.tools:
        return out, [_template_tool(t) for t in tools] if tools else tools
    listed = HERMES_TOOLS.format(tools="\n".join(json.dumps(t.get("function", t)) for t in tools))
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{listed}"}
    else:
        out.insert(0, {"role": "system", "content": listed})
    return out, None


def _with_mapping_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function", {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):  # else passed on as the model wrote it
            return {**call, "function": {**function, "arguments": json.loads(arguments)}}
    return call


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI message -> what chat templates expect (content parts joined to a string)."""
    out = {k: v for k, v in message.items() if v is not None}
    content = message.get("content")
    if isinstance(content, list):
        out["content"] = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    elif content is None:
        out["content"] = ""
    return out


def _template_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool with the optional parts every template may read (GPT-OSS's reads `description` unchecked)."""
    function = tool.get("function", tool)
    optional = {"description": "", "parameters": {"type": "object", "properties": {}}}
    filled = {**function, **{key: value for key, value in optional.items() if key not in function}}
    return {**tool, "function": filled} if "function" in tool else filled


def render_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """`template_kwargs` are the request's `chat_template_kwargs` (vLLM's name), e.g. Qwen3's `enable_thinking`."""
    rendered, tools = _fallbacks([_template_message(m) for m in messages], tools, tool_support(tokenizer))
    ids = tokenizer.apply_chat_template(
        rendered,
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
        **(template_kwargs or {}),
    )
    return [int(i) for i in ids]


def oversized(messages: list[dict[str, Any]], limit_tokens: int | None, token_bytes: int) -> int | None:
    """The messages' size in bytes if more than `limit_tokens` tokens of at most `token_bytes` bytes each can hold,
    else None: such messages are refused before the chat template, which would take seconds on megabytes."""
    if limit_tokens is None:
        return None
    size = len(json.dumps(messages, ensure_ascii=False).encode())
    return size if size > limit_tokens * token_bytes else None


def render_prompt_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    return render_ids(tokenizer, messages, tools, add_generation_prompt=True, template_kwargs=template_kwargs)


def has_response_parser(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None))


def attach_response_parser(tokenizer: Any) -> Any:
    """The tokenizer with TRL's response parser for its chat template, when it has none and TRL knows the template."""
    if has_response_parser(tokenizer) or not getattr(tokenizer, "chat_template", None):
        return tokenizer
    from trl.chat_template_utils import add_response_schema

    with contextlib.suppress(ValueError):  # a template TRL does not know: the hermes and Mistral parsers remain
        add_response_schema(tokenizer)
    return tokenizer


def parse_assistant(
    tokenizer: Any,
    text: str,
    token_ids: list[int] | None = None,
    prompt_ids: list[int] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An OpenAI assistant message from a reply: `text` with special tokens stripped, `token_ids` as sampled (a
    family's markers may be special tokens), `prompt_ids` what came before them (the parser anchors on it)."""
    parsed = _by_response_parser(tokenizer, text, token_ids, prompt_ids, tools)
    if parsed is None or not parsed.get("tool_calls"):  # the fallbacks read the markers special tokens would hide
        raw = text if token_ids is None else tokenizer.decode(token_ids, skip_special_tokens=False)
        if _MISTRAL_CALLS in raw:
            parsed = _parse_mistral(raw, tokenizer)
        elif _HARMONY_CALL.search(raw):
            parsed = _parse_harmony(raw, parsed)
        elif parsed is None or "<tool_call>" in text:
            parsed = _parse_hermes(text)
    return _openai_message(parsed)


def _by_response_parser(
    tokenizer: Any,
    text: str,
    token_ids: list[int] | None,
    prompt_ids: list[int] | None,
    tools: list[dict[str, Any]] | None,
) -> dict[str, Any] | None:
    if not has_response_parser(tokenizer):
        return None
    try:
        if token_ids is not None and getattr(tokenizer, "response_template", None):
            parsed = tokenizer.parse_response(token_ids, prefix=prompt_ids or [], tools=tools)
        else:
            parsed = tokenizer.parse_response(text, prefix="")
    except (ValueError, TypeError, KeyError):
        return None  # e.g. a malformed call: the fallbacks decide, and keep it as text
    if not isinstance(parsed, dict):
        return None
    if isinstance(parsed.get("content"), str) and tokenizer.eos_token:
        parsed["content"] = parsed["content"].removesuffix(tokenizer.eos_token)
    return parsed


_MISTRAL_CALLS = "[TOOL_CALLS]"
# GPT-OSS's harmony call, the recipient before or after the channel: `<|start|>assistant to=functions.f<|channel|>commentary
# json<|message|>{...}<|call|>` (how its template renders calls) or `<|channel|>commentary to=functions.f <|constrain|>json
# <|message|>{...}<|call|>` (how the model writes them, which TRL's parser does not match).
_HARMONY_CALL = re.compile(
    r"(?:to=functions\.(?P<before>[\w.-]+)\s*)?<\|channel\|>commentary(?:\s+to=functions\.(?P<after>[\w.-]+))?"
    r"\s*(?:<\|constrain\|>)?\s*json<\|message\|>(?P<arguments>.*?)<\|call\|>",
    re.DOTALL,
)
_HARMONY_REASONING = re.compile(r"<\|channel\|>analysis<\|message\|>(.*?)<\|end\|>", re.DOTALL)


def _parse_harmony(raw: str, parsed: dict[str, Any] | None) -> dict[str, Any]:
    """GPT-OSS calls in either order of recipient and channel; a call whose arguments are not JSON stays text."""
    calls = []
    for match in _HARMONY_CALL.finditer(raw):
        name = match["before"] or match["after"]
        try:
            arguments = json.loads(match["arguments"])
        except json.JSONDecodeError:
            return parsed or {"role": "assistant", "content": raw}
        if not name:
            return parsed or {"role": "assistant", "content": raw}
        calls.append({"type": "function", "function": {"name": name, "arguments": arguments}})
    reasoning = _HARMONY_REASONING.search(raw)
    message: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": calls}
    if reasoning:
        message["reasoning_content"] = reasoning[1]
    return message


def _parse_mistral(raw: str, tokenizer: Any) -> dict[str, Any]:
    """Mistral's `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (its v3 format), else the text as content."""
    head, _, calls_text = raw.partition(_MISTRAL_CALLS)
    for end in (tokenizer.eos_token or "", "</s>"):
        if end:
            calls_text = calls_text.split(end)[0]
    try:
        calls = json.loads(calls_text.strip())
    except json.JSONDecodeError:
        return {"role": "assistant", "content": raw}
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
        return {"role": "assistant", "content": raw}
    tool_calls = [
        {"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}} for c in calls
    ]
    return {"role": "assistant", "content": head.strip(), "tool_calls": tool_calls}


def _parse_hermes(text: str) -> dict[str, Any]:
    blocks = _HERMES_CALL.findall(text)
    if not blocks:
        return {"role": "assistant", "content": text}
    calls = []
    for block in blocks:
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            return {"role": "assistant", "content": text}
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return {"role": "assistant", "content": text}
        calls.append({"type": "function", "function": {"name": call["name"], "arguments": call.get("arguments", {})}})
    content = text[: text.index("<tool_call>")].strip()
    return {"role": "assistant", "content": content, "tool_calls": calls}


def _call_id() -> str:
    """9 letters and digits: the one form every family's template takes back (Mistral's refuses any other)."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


def _openai_message(parsed: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": parsed.get("content") or None}
    reasoning = parsed.get("reasoning_content") or parsed.get("thinking")  # GPT-OSS's parser names it thinking
    if reasoning:
        message["reasoning_content"] = reasoning
    calls = []
    for call in parsed.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        calls.append(
            {
                "id": _call_id(),
                "type": "function",
                "function": {
                    "name": function.get("name", ""),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return message

"""Chat messages to prompt token ids, and generated text back to an OpenAI assistant message.

Prompts go through the model's own chat template. Tool calls are parsed in the model's own format:
the tokenizer's response parser (transformers 5 `parse_response`, attached by TRL for known
templates) when it has one, else the common hermes `<tool_call>{json}</tool_call>` format. Text
that looks like a tool call but does not parse stays plain content: a bad generation is data for
training, never a server error.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI message -> what chat templates expect (content parts joined to a string)."""
    out = {k: v for k, v in message.items() if v is not None}
    content = message.get("content")
    if isinstance(content, list):
        out["content"] = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    elif content is None:
        out["content"] = ""
    return out


def render_ids(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *, add_generation_prompt: bool
) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [_template_message(m) for m in messages],
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
    )
    return [int(i) for i in ids]


def render_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    return render_ids(tokenizer, messages, tools, add_generation_prompt=True)


def _has_response_parser(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None))


def parse_assistant(tokenizer: Any, text: str) -> dict[str, Any]:
    """An OpenAI assistant message from generated text (special tokens already stripped)."""
    parsed: dict[str, Any] | None = None
    if _has_response_parser(tokenizer):
        try:
            parsed = tokenizer.parse_response(text, prefix="")
        except (ValueError, TypeError, KeyError):
            parsed = None  # e.g. a malformed <tool_call>: the hermes path decides, and keeps it as text
    if parsed is None or (not parsed.get("tool_calls") and "<tool_call>" in text):
        parsed = _parse_hermes(text)
    return _openai_message(parsed)


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


def _openai_message(parsed: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": parsed.get("content") or None}
    if parsed.get("reasoning_content"):
        message["reasoning_content"] = parsed["reasoning_content"]
    calls = []
    for call in parsed.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
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

"""Templates that ignore tools still show the model its tools, its own calls and their results.

SmolLM2's template renders only `role` and `content`: without the fallback, the tools offered, the
assistant's tool calls and (for stricter templates) the tool results would silently vanish from the
prompt. A template that renders them itself (Qwen3's) is left alone.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from art_agents.server.models.chat_format import hermes_call, parse_assistant, render_prompt_ids, tool_support

CONTENT_ONLY = (  # SmolLM2-135M-Instruct's template
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NO_TOOL_ROLE = (  # a template that only knows three roles
    "{% for message in messages %}{% if message['role'] in ['system', 'user', 'assistant'] %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "calculate", "parameters": {"type": "object"}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "2*3"}'}}
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "What is 2*3?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "6"},
]


def with_template(tokenizer: Any, template: str) -> Any:
    other = copy.deepcopy(tokenizer)
    other.chat_template = template
    other.__dict__.pop("_art_tool_support", None)
    return other


def prompt_text(tokenizer: Any) -> str:
    return str(tokenizer.decode(render_prompt_ids(tokenizer, MESSAGES, TOOLS)))


def test_a_content_only_template_gets_tools_calls_in_hermes_text(tokenizer: Any) -> None:
    smol = with_template(tokenizer, CONTENT_ONLY)
    assert not tool_support(smol).tools and not tool_support(smol).calls
    text = prompt_text(smol)
    assert text.startswith("<|im_start|>system\nUse the calculator.\n\nYou can call these tools:\n<tools>\n")
    assert '{"name": "calculate", "parameters": {"type": "object"}}' in text
    assert (
        '<|im_start|>assistant\n<tool_call>{"name": "calculate", "arguments": {"expression": "2*3"}}</tool_call>'
        in text
    )
    assert "<|im_start|>tool\n6<|im_end|>" in text  # this template renders tool messages itself
    # what the model is shown is exactly what the server parses back
    parsed = parse_assistant(smol, hermes_call(CALL))
    assert parsed["tool_calls"][0]["function"] == {"name": "calculate", "arguments": '{"expression": "2*3"}'}


def test_a_template_without_a_tool_role_gets_results_as_tool_responses(tokenizer: Any) -> None:
    strict = with_template(tokenizer, NO_TOOL_ROLE)
    assert not tool_support(strict).results
    assert "<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>" in prompt_text(strict)


def test_a_tool_aware_template_is_left_alone(tokenizer: Any) -> None:
    support = tool_support(tokenizer)  # the tiny model's Qwen3 template
    assert support.tools and support.calls and support.results
    text = prompt_text(tokenizer)
    assert "You can call these tools" not in text and "<tool_response>\n6\n</tool_response>" in text


@pytest.mark.parametrize("arguments", ['{"expression": "2*3"}', {"expression": "2*3"}, "not json"])
def test_hermes_call_renders_any_argument_shape(arguments: Any) -> None:
    rendered = hermes_call({"function": {"name": "calculate", "arguments": arguments}})
    assert rendered.startswith('<tool_call>{"name": "calculate", "arguments": ') and rendered.endswith("</tool_call>")

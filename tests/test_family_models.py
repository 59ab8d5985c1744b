"""Each family's tiny model renders, runs and parses tool use in that family's own format after a reload.

An engine is only as right for a family as the tokens it renders, stops on, decodes and parses: these
tests pin what the family models give it, so an engine test on them means the same as on the real model.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from art_agents.server.ops.family_models import FAMILIES, SPECS, Family, build_family_model, build_tokenizer

torch = pytest.importorskip("torch")

CALL_ID = "call12345"  # Mistral's template takes only 9 alphanumeric characters
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city."}},
                "required": ["city"],
            },
        },
    }
]
PROMPT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
CALL = {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
RESULT = "Sunny, 21 degrees."
ANSWER = "It is sunny and 21 degrees in Paris."
REASONING = "The user wants the weather."

# The call (name and arguments), the result and the final answer's reasoning as each family renders them.
RENDERED: dict[Family, tuple[str, ...]] = {
    "qwen2_5": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>",
    ),
    "qwen3": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>",
        f"<|im_start|>assistant\n<think>\n{REASONING}\n</think>\n\n{ANSWER}<|im_end|>",
    ),
    "llama3_1": (
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
        f'<|start_header_id|>ipython<|end_header_id|>\n\n"{RESULT}"<|eot_id|>',
    ),
    "llama3_2": (
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
        f'<|start_header_id|>ipython<|end_header_id|>\n\n"{RESULT}"<|eot_id|>',
    ),
    "gpt_oss": (
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        f'<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"{RESULT}"<|end|>',
        f"<|start|>assistant<|channel|>analysis<|message|>{REASONING}<|end|>",
        f"<|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>",
    ),
    "gemma4": (
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
        f'<|tool_response>response:get_weather{{value:<|"|>{RESULT}<|"|>}}<tool_response|>',
        f"<|channel>thought\n{REASONING}\n<channel|>{ANSWER}<turn|>",
    ),
    "mistral": (
        f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {{"city": "Paris"}}, "id": "{CALL_ID}"}}]</s>',
        f'[TOOL_RESULTS] {{"content": "{RESULT}", "call_id": "{CALL_ID}"}}[/TOOL_RESULTS]',
        f" {ANSWER}</s>",
    ),
}
TOOLS_RENDERED: dict[Family, str] = {  # where the template shows the model its tools
    "qwen2_5": '<tools>\n{"type": "function", "function": {"name": "get_weather"',
    "qwen3": '<tools>\n{"type": "function", "function": {"name": "get_weather"',
    "llama3_1": '"name": "get_weather"',
    "llama3_2": '"name": "get_weather"',
    "gpt_oss": "namespace functions {\n\n// Get the current weather in a city.\ntype get_weather = (_: {",
    "gemma4": '<|tool>declaration:get_weather{description:<|"|>Get the current weather in a city.<|"|>',
    "mistral": '[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "get_weather"',
}


@pytest.fixture(scope="session")
def family_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("family-models")


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> Family:
    return request.param


@pytest.fixture
def loaded(family: Family, family_root: Path) -> tuple[Any, Any]:
    """The family's tokenizer and model as `from_pretrained` loads them (built once per session)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = family_root / family
    if not path.exists():
        build_family_model(path, family)
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)


def conversation(family: Family) -> list[dict[str, Any]]:
    final: dict[str, Any] = {"role": "assistant", "content": ANSWER}
    if SPECS[family].reasoning_key:
        final[SPECS[family].reasoning_key] = REASONING
    return [
        *copy.deepcopy(PROMPT),
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": RESULT},
        final,
    ]


def render(tokenizer: Any, family: Family, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    """The chat template's text (or, with `tokenize=True`, its ids), with reasoning on where it is opt-in."""
    kwargs.setdefault("tokenize", False)
    if family == "gemma4":
        kwargs.setdefault("enable_thinking", True)
    return tokenizer.apply_chat_template(messages, tools=TOOLS, **kwargs)


def test_tokenizer_and_config_match_the_family(family: Family, loaded: tuple[Any, Any]) -> None:
    tokenizer, model = loaded
    spec = SPECS[family]
    assert type(model.config).__name__ == spec.config_class
    assert tokenizer.eos_token == spec.eos_token and tokenizer.pad_token == spec.pad_token
    stop_ids = tokenizer.convert_tokens_to_ids(list(spec.stop_tokens))
    assert model.generation_config.eos_token_id == (stop_ids if len(stop_ids) > 1 else stop_ids[0])
    markers = spec.special_tokens + spec.plain_tokens
    text = "".join(markers)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.convert_ids_to_tokens(ids) == list(markers)  # each marker is one token
    assert tokenizer.decode(ids, skip_special_tokens=True) == "".join(spec.plain_tokens)
    sample = f"Hello,  world!\n\n It's 21 degrees.{spec.example_output}"
    encoded = tokenizer(sample).input_ids
    assert (encoded[0] == tokenizer.bos_token_id) == spec.prepends_bos
    assert encoded == build_tokenizer(family)(sample).input_ids  # the reload tokenizes as built


def test_tool_conversation_renders_in_the_family_format(family: Family, loaded: tuple[Any, Any]) -> None:
    from trl.chat_template_utils import supports_tool_calling

    tokenizer, model = loaded
    # TRL probes with a call without an id, which Mistral's template rejects as the real one does.
    assert supports_tool_calling(tokenizer) == (family not in ("gemma3", "mistral"))
    if family == "gemma3":  # Gemma 3's template has no tool support (and rejects a 'tool' turn)
        messages = [*PROMPT, {"role": "assistant", "content": ANSWER}]
        expected = (
            f"<start_of_turn>user\n{PROMPT[0]['content']}\n\n{PROMPT[1]['content']}<end_of_turn>",
            f"<start_of_turn>model\n{ANSWER}<end_of_turn>",
        )
    else:
        messages = conversation(family)
        expected = (TOOLS_RENDERED[family], *RENDERED[family])
    text = render(tokenizer, family, messages)
    for fragment in expected:
        assert fragment in text
    ids = render(tokenizer, family, messages, tokenize=True, return_dict=True)["input_ids"]
    assert tokenizer.decode(ids) == text and ids == tokenizer(text, add_special_tokens=False).input_ids
    input_ids = torch.tensor([ids])
    output = model(input_ids, labels=input_ids)
    assert output.logits.shape == (1, len(ids), len(tokenizer))
    output.loss.backward()
    assert torch.isfinite(output.loss)


def test_parser_reads_the_family_output(family: Family, loaded: tuple[Any, Any]) -> None:
    tokenizer, _ = loaded
    spec = SPECS[family]
    if family in ("gemma3", "mistral"):  # TRL has no parser for these templates
        assert getattr(tokenizer, "response_template", None) is None
        return
    prompt = render(tokenizer, family, PROMPT, add_generation_prompt=True)
    output_ids = tokenizer(spec.example_output, add_special_tokens=False).input_ids
    from_text = tokenizer.parse_response(spec.example_output, prefix=prompt)
    from_ids = tokenizer.parse_response(output_ids, prefix=tokenizer(prompt, add_special_tokens=False).input_ids)
    assert from_text == from_ids
    [call] = from_text["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    if spec.reasoning_key:
        assert from_text[spec.reasoning_key] == REASONING
    stripped = tokenizer.decode(output_ids, skip_special_tokens=True)
    if not spec.keep_special_tokens:
        assert tokenizer.parse_response(stripped, prefix=prompt) == from_text
    assert all(marker not in stripped for marker in spec.output_markers if marker in spec.special_tokens)

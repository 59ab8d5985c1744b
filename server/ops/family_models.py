"""Tiny random models of real model families, each with that family's chat template and control tokens.

An engine that serves and trains Qwen, Llama, GPT-OSS, Gemma or Mistral models renders prompts with
the family's chat template, stops on the family's end tokens, decodes with or without special
tokens, parses the family's tool-call format and trains on the sampled ids. Getting any of these
wrong only shows with that family, and a real checkpoint is gigabytes behind a model hub. The
models built here load offline through `AutoTokenizer`/`AutoModelForCausalLM.from_pretrained` and
behave like the real family in everything but their weights and vocabulary: the family's own
transformers architecture (tiny, random, fp32, seeded), its real chat template (from the installed
TRL package; Mistral's is written out below), every control token the template and the output
format use as ONE token, special or plain as the real tokenizer marks it (so
`decode(skip_special_tokens=True)` drops the same markers), the real eos and stop ids, and TRL's
response parser where TRL knows the template (saved with the tokenizer, so `parse_response` works
after a reload). The vocabulary is the byte-level BPE of `tiny_model`, so any text round-trips.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from art_agents.server.ops.tiny_model import train_byte_level_bpe

Family = Literal["qwen2_5", "qwen3", "llama3_1", "llama3_2", "gpt_oss", "gemma3", "gemma4", "mistral"]

# Mistral's v3 tool-calling format (Mistral-7B-Instruct-v0.3, Mistral-Small-Instruct-2409), which no
# installed package ships: tools in `[AVAILABLE_TOOLS]` before the last user turn, the system prompt
# prepended to that turn (as mistral_common does), calls as `[TOOL_CALLS] [{"name", "arguments", "id"}]`
# closed by eos, results as `[TOOL_RESULTS] {"content", "call_id"}[/TOOL_RESULTS]`. Like the real
# template it requires alternating user/assistant turns and 9-character alphanumeric tool call ids.
MISTRAL_V3_CHAT_TEMPLATE = """\
{%- if messages[0]["role"] == "system" -%}
    {%- set system_message = messages[0]["content"] -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set system_message = none -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- set ns = namespace(last_user=-1, turns=0) -%}
{%- for message in loop_messages -%}
    {%- if message["role"] == "user" -%}
        {%- set ns.last_user = loop.index0 -%}
    {%- endif -%}
    {%- if message["role"] in ["user", "assistant"] and not message.tool_calls -%}
        {%- if (message["role"] == "user") != (ns.turns % 2 == 0) -%}
            {{- raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") -}}
        {%- endif -%}
        {%- set ns.turns = ns.turns + 1 -%}
    {%- endif -%}
{%- endfor -%}
{%- macro check_id(call_id) -%}
    {%- if call_id is not string or call_id | length != 9 or not call_id.isalnum() -%}
        {{- raise_exception("Tool call ids must be 9 alphanumeric characters, got: " ~ call_id) -}}
    {%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- for message in loop_messages -%}
    {%- if message["role"] == "user" -%}
        {%- if tools and loop.index0 == ns.last_user -%}
            {{- "[AVAILABLE_TOOLS] " + tools | tojson + "[/AVAILABLE_TOOLS]" -}}
        {%- endif -%}
        {%- if system_message and loop.index0 == ns.last_user -%}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" -}}
        {%- else -%}
            {{- "[INST] " + message["content"] + "[/INST]" -}}
        {%- endif -%}
    {%- elif message["role"] == "assistant" and message.tool_calls -%}
        {{- "[TOOL_CALLS] [" -}}
        {%- for tool_call in message.tool_calls -%}
            {%- set function = tool_call.function if tool_call.function is defined else tool_call -%}
            {{- check_id(tool_call.id) -}}
            {{- '{"name": ' + function.name | tojson + ', "arguments": ' -}}
            {{- function.arguments if function.arguments is string else function.arguments | tojson -}}
            {{- ', "id": ' + tool_call.id | tojson + "}" + (", " if not loop.last else "") -}}
        {%- endfor -%}
        {{- "]" + eos_token -}}
    {%- elif message["role"] == "assistant" -%}
        {{- " " + message["content"] | trim + eos_token -}}
    {%- elif message["role"] == "tool" -%}
        {{- check_id(message.tool_call_id) -}}
        {{- "[TOOL_RESULTS] " + {"content": message.content, "call_id": message.tool_call_id} | tojson -}}
        {{- "[/TOOL_RESULTS]" -}}
    {%- else -%}
        {{- raise_exception("Only system, user, assistant and tool roles are supported") -}}
    {%- endif -%}
{%- endfor -%}
"""

_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_LLAMA3_SPECIAL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
)
_LLAMA3_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'


@dataclass(frozen=True)
class FamilySpec:
    """What makes a family's tokenizer, template and config look like the real thing.

    `special_tokens` are added as special (`decode(skip_special_tokens=True)` drops them), `plain_tokens`
    as single tokens that decode as text, both as the real tokenizer marks them. `output_markers` are
    the tokens that frame a tool call or reasoning in the model's output; where any is special, the
    engine must decode with `skip_special_tokens=False` before parsing (`keep_special_tokens`).
    `example_output` is what the model generates after the generation prompt to call
    `get_weather(city="Paris")`, with its reasoning where the family has a reasoning format.
    """

    config_class: str  # transformers config class of the family's text-only causal LM
    template: str  # "trl:<attribute of trl.chat_template_utils>", or "mistral_v3" (this module's)
    special_tokens: tuple[str, ...]
    eos_token: str  # tokenizer.eos_token
    stop_tokens: tuple[str, ...]  # generation_config.eos_token_id (and config.eos_token_id)
    example_output: str
    plain_tokens: tuple[str, ...] = ()
    bos_token: str | None = None
    pad_token: str | None = None  # None where the real tokenizer has no pad token (Llama 3, Mistral)
    prepends_bos: bool = False  # `tokenizer(text)` prepends bos, as the real tokenizer does
    tokenizer_class: Literal["TokenizersBackend", "Qwen2Tokenizer"] = "TokenizersBackend"
    output_markers: tuple[str, ...] = ()
    reasoning_key: str | None = None  # assistant message key the template renders as reasoning
    config_kwargs: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""

    @property
    def keep_special_tokens(self) -> bool:
        """Whether the output format only parses when decoded with `skip_special_tokens=False`."""
        return any(marker in self.special_tokens for marker in self.output_markers)


def _llama3(template: str, *, rope_factor: float, tied: bool, notes: str) -> FamilySpec:
    """Llama 3.1 and 3.2 differ in their template, RoPE scaling and tied embeddings only."""
    return FamilySpec(
        config_class="LlamaConfig",
        template=template,
        special_tokens=_LLAMA3_SPECIAL,
        eos_token="<|eot_id|>",
        bos_token="<|begin_of_text|>",
        stop_tokens=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
        prepends_bos=True,
        output_markers=("<|eot_id|>",),
        example_output=_LLAMA3_CALL,
        config_kwargs={
            "tie_word_embeddings": tied,
            "max_position_embeddings": 131072,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": rope_factor,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
        notes=notes,
    )


SPECS: dict[Family, FamilySpec] = {
    "qwen2_5": FamilySpec(
        config_class="Qwen2Config",
        template="trl:qwen2_5_chat_template",
        special_tokens=_QWEN_SPECIAL,
        plain_tokens=("<tool_call>", "</tool_call>"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        tokenizer_class="Qwen2Tokenizer",
        output_markers=("<tool_call>", "</tool_call>"),
        example_output='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        config_kwargs={"tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
        notes="Qwen2Tokenizer (Qwen's pre-tokenizer), which transformers 5 forces for a qwen2 config anyway. "
        "The template renders <tool_response> as plain text: Qwen2.5 has no such token.",
    ),
    "qwen3": FamilySpec(
        config_class="Qwen3Config",
        template="trl:qwen3_chat_template",
        special_tokens=_QWEN_SPECIAL,
        plain_tokens=("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
        tokenizer_class="Qwen2Tokenizer",
        output_markers=("<think>", "</think>", "<tool_call>", "</tool_call>"),
        reasoning_key="reasoning_content",
        example_output="<think>\nThe user wants the weather.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        config_kwargs={"tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    ),
    "llama3_1": _llama3(
        "trl:llama3_1_chat_template",
        rope_factor=8.0,
        tied=False,
        notes="A tool call is bare JSON with 'parameters' (no marker), one per turn; TRL's parser closes it on "
        "'}<|eot_id|>', so it needs the stop token in the text (or the ids). <|python_tag|> only precedes "
        "built-in tool calls (builtin_tools=...), which the template ends with <|eom_id|>.",
    ),
    "llama3_2": _llama3(
        "trl:llama3_2_chat_template",
        rope_factor=32.0,
        tied=True,
        notes="As Llama 3.1, without built-in tools; the system prompt carries today's date.",
    ),
    "gpt_oss": FamilySpec(
        config_class="GptOssConfig",
        template="trl:gptoss_chat_template",
        special_tokens=(
            "<|startoftext|>",
            "<|endoftext|>",
            "<|return|>",
            "<|constrain|>",
            "<|channel|>",
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|call|>",
        ),
        eos_token="<|return|>",
        bos_token="<|startoftext|>",
        pad_token="<|endoftext|>",
        stop_tokens=("<|return|>", "<|endoftext|>", "<|call|>"),
        output_markers=("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|call|>", "<|return|>"),
        reasoning_key="thinking",
        example_output="<|channel|>analysis<|message|>The user wants the weather.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>',
        config_kwargs={
            "tie_word_embeddings": False,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "intermediate_size": 64,
            "sliding_window": 128,
        },
        notes="Harmony format. The template renders a call as 'commentary json' and TRL's parser expects "
        "that; the real model often writes '<|channel|>commentary to=functions.NAME <|constrain|>json', "
        "which that parser does not match. Reasoning is read from and parsed into 'thinking'.",
    ),
    "gemma3": FamilySpec(
        config_class="Gemma3TextConfig",
        template="trl:gemma3_chat_template",
        special_tokens=("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"),
        eos_token="<eos>",
        bos_token="<bos>",
        pad_token="<pad>",
        stop_tokens=("<eos>", "<end_of_turn>"),
        prepends_bos=True,
        example_output='```tool_code\nget_weather(city="Paris")\n```<end_of_turn>',
        config_kwargs={
            "tie_word_embeddings": True,
            "query_pre_attn_scalar": 16,
            "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention"],
        },
        notes="Gemma 3's template has no tool support: it ignores `tools` and `tool_calls` and rejects a "
        "'tool' turn (roles must alternate). Tool use is prompted; the example output is Google's "
        "suggested ```tool_code``` convention, which nothing parses. Text-only Gemma3ForCausalLM.",
    ),
    "gemma4": FamilySpec(
        config_class="Gemma4TextConfig",
        template="trl:gemma4_v5_chat_template",
        special_tokens=(
            "<pad>",
            "<eos>",
            "<bos>",
            "<|tool>",
            "<tool|>",
            "<|tool_call>",
            "<tool_call|>",
            "<|tool_response>",
            "<tool_response|>",
            '<|"|>',
            "<|think|>",
            "<|channel>",
            "<channel|>",
            "<|turn>",
            "<turn|>",
            "<|image|>",
            "<|audio|>",
            "<|video|>",
        ),
        eos_token="<eos>",
        bos_token="<bos>",
        pad_token="<pad>",
        stop_tokens=("<eos>", "<turn|>", "<|tool_response>"),
        prepends_bos=True,
        output_markers=("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|tool_response>"),
        reasoning_key="reasoning_content",
        example_output="<|channel>thought\nThe user wants the weather.<channel|>"
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_response>',
        config_kwargs={
            "tie_word_embeddings": True,
            "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention"],
            "global_head_dim": 32,
            "hidden_size_per_layer_input": 8,
            "final_logit_softcapping": 30.0,
        },
        notes="Text-only Gemma4ForCausalLM with per-layer inputs (as the E2B/E4B models). Template: TRL's "
        "gemma4_v5 (google/gemma-4-E2B-it's current revision). A call ends the turn with "
        "<|tool_response>, which is a stop token; reasoning needs enable_thinking=True in the prompt.",
    ),
    "mistral": FamilySpec(
        config_class="MistralConfig",
        template="mistral_v3",
        special_tokens=(
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
        eos_token="</s>",
        bos_token="<s>",
        stop_tokens=("</s>",),
        prepends_bos=True,
        output_markers=("[TOOL_CALLS]",),
        example_output='[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]</s>',
        config_kwargs={
            "tie_word_embeddings": False,
            "sliding_window": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        },
        notes="Template written in this module (MISTRAL_V3_CHAT_TEMPLATE); TRL has no parser for it. The "
        "real tokenizer is SentencePiece; here it is byte-level BPE.",
    ),
}
FAMILIES: tuple[Family, ...] = tuple(SPECS)


def chat_template(spec: FamilySpec) -> str:
    """The family's chat template text."""
    if spec.template == "mistral_v3":
        return MISTRAL_V3_CHAT_TEMPLATE
    import trl.chat_template_utils as trl_templates

    return getattr(trl_templates, spec.template.removeprefix("trl:"))


def _wrap_tokenizer(spec: FamilySpec, vocab_size: int):  # -> transformers.TokenizersBackend
    """The BPE in the family's tokenizer class, with its bos/eos/pad tokens."""
    from transformers import Qwen2Tokenizer, TokenizersBackend

    backend = train_byte_level_bpe(vocab_size)
    named = {"bos_token": spec.bos_token, "eos_token": spec.eos_token, "pad_token": spec.pad_token, "unk_token": None}
    if spec.tokenizer_class == "Qwen2Tokenizer":  # it rebuilds Qwen's pre-tokenizer from vocab and merges on load
        bpe = json.loads(backend.to_str())["model"]
        return Qwen2Tokenizer(vocab=bpe["vocab"], merges=[tuple(merge) for merge in bpe["merges"]], **named)
    return TokenizersBackend(tokenizer_object=backend, **named)


def _prepend_bos(tokenizer, bos_token: str) -> None:
    from tokenizers import processors

    bos = (bos_token, tokenizer.convert_tokens_to_ids(bos_token))
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos_token} $A", pair=f"{bos_token} $A {bos_token} $B", special_tokens=[bos]
    )


def _attach_response_parser(tokenizer) -> None:
    """Let TRL attach its response parser where it knows the template (not Gemma 3's, nor Mistral's)."""
    from trl.chat_template_utils import add_response_schema

    with contextlib.suppress(ValueError):  # raised for a template TRL has no parser for
        add_response_schema(tokenizer)


def build_tokenizer(family: Family, *, vocab_size: int = 512):  # -> transformers.TokenizersBackend
    """The family's tokenizer: tiny BPE, the family's control tokens, chat template and response parser."""
    from tokenizers import AddedToken

    spec = SPECS[family]
    tokenizer = _wrap_tokenizer(spec, vocab_size)
    tokenizer.add_tokens(
        [AddedToken(token, special=True, normalized=False) for token in spec.special_tokens], special_tokens=True
    )
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in spec.plain_tokens])
    if spec.prepends_bos:
        _prepend_bos(tokenizer, spec.bos_token)
    tokenizer.chat_template = chat_template(spec)
    _attach_response_parser(tokenizer)  # saved in tokenizer_config.json, so it survives a reload
    return tokenizer


def _model_config(spec: FamilySpec, tokenizer, hidden_size: int, num_layers: int):  # -> PreTrainedConfig
    import transformers

    ids = tokenizer.convert_tokens_to_ids
    stop_ids = [ids(token) for token in spec.stop_tokens]
    kwargs = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden_size // 4,
        "max_position_embeddings": 4096,
        "eos_token_id": stop_ids if len(stop_ids) > 1 else stop_ids[0],
        "bos_token_id": ids(spec.bos_token) if spec.bos_token else None,
        "pad_token_id": ids(spec.pad_token) if spec.pad_token else None,
        **spec.config_kwargs,
    }
    if spec.config_class == "Gemma4TextConfig":
        kwargs["vocab_size_per_layer_input"] = len(tokenizer)
    return getattr(transformers, spec.config_class)(**kwargs)


def build_family_model(
    path: str | Path, family: Family, *, seed: int = 0, hidden_size: int = 64, num_layers: int = 2
) -> Path:
    """Write a random-initialised model of `family` with its tokenizer and chat template to `path`; returns it."""
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    spec = SPECS[family]
    tokenizer = build_tokenizer(family)
    config = _model_config(spec, tokenizer, hidden_size, num_layers)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    marker = {"family": family, "seed": seed, "built_by": "art_agents"}
    (path / "family_model.json").write_text(json.dumps(marker) + "\n")
    return path

"""What this server does with a model's chat format, for `art-agents doctor --model`: which family its chat template
is, whether tools render natively or through the hermes fallback, which parser reads its replies, and what is known
not to work, with the fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from art_agents.server.models.chat_format import ToolSupport, has_response_parser, tool_support

# TRL's copies of each family's template (trl/chat_templates), by the attribute that holds it.
_KNOWN_TEMPLATES = {
    "qwen2_5_chat_template": "Qwen 2.5",
    "qwen3_chat_template": "Qwen3",
    "qwen3_instruct_2507_chat_template": "Qwen3 Instruct 2507",
    "llama3_1_chat_template": "Llama 3.1",
    "llama3_2_chat_template": "Llama 3.2",
    "gptoss_chat_template": "GPT-OSS",
    "gemma3_chat_template": "Gemma 3",
    **{f"gemma4{suffix}_chat_template": "Gemma 4" for suffix in ("", "_v2", "_v3", "_v4", "_v5")},
}
# Markers that name a family when the template is not one of TRL's copies (a newer revision, a fine-tune).
_MARKERS = [
    ("<|channel|>", "GPT-OSS (harmony)"),
    ("<|turn>", "Gemma 4"),
    ("<start_of_turn>", "Gemma"),
    ("<|start_header_id|>", "Llama 3"),
    ("[INST]", "Mistral"),
    ("<|im_start|>", "Qwen / ChatML"),
]


@dataclass(frozen=True)
class FamilyReport:
    family: str
    renders: ToolSupport | None  # None: no chat template at all
    parser: str
    notes: list[str] = field(default_factory=list)


def family_report(tokenizer: Any, model_type: str | None = None) -> FamilyReport:
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return FamilyReport(
            family=model_type or "unknown",
            renders=None,
            parser="none",
            notes=[
                "no chat template: every chat request is refused with a 400. Fix: give the tokenizer one "
                "(chat_template.jinja beside tokenizer_config.json), e.g. the instruct model's"
            ],
        )
    support = tool_support(tokenizer)
    return FamilyReport(
        _family(template, model_type), support, _parser(tokenizer, template), _notes(tokenizer, support)
    )


def _family(template: str, model_type: str | None) -> str:
    import trl.chat_template_utils as trl_templates

    for attribute, family in _KNOWN_TEMPLATES.items():
        if template == getattr(trl_templates, attribute, None):
            return f"{family} (its chat template, as TRL ships it)"
    for marker, family in _MARKERS:
        if marker in template:
            return f"{family} (by the template's {marker} markers)"
    return f"{model_type or 'unknown'} (a chat template of its own)"


def _parser(tokenizer: Any, template: str) -> str:
    if has_response_parser(tokenizer):
        return "the template's response parser (transformers parse_response, TRL's for this template)"
    if "[TOOL_CALLS]" in template:
        return "Mistral's [TOOL_CALLS] JSON list"
    return "hermes <tool_call>{json}</tool_call> (the fallback)"


def _notes(tokenizer: Any, support: ToolSupport) -> list[str]:
    notes = []
    missing = [part for part, ok in (("tools", support.tools), ("calls", support.calls), ("results", support.results))
               if not ok]  # fmt: skip
    if missing:
        notes.append(
            f"the template does not render tool {', '.join(missing)}: they are written in the hermes format "
            "(tools listed in the system message, <tool_call> JSON, <tool_response> turns). A model never trained on "
            "that format rarely calls tools: warm it up first with SFT on demonstrations (model.train_sft)"
        )
    if _drops_earlier_reasoning(tokenizer):
        notes.append(
            "the template drops earlier turns' reasoning, so a turn's prompt does not extend the previous turn: a "
            "multi-turn rollout trains as one sequence per turn (the step's `sequences`), on the sampled tokens, "
            "never re-tokenized"
        )
    template = tokenizer.chat_template
    if "[INST]" in template:
        notes.append(
            "Mistral's template takes only strictly alternating user/assistant turns and 9-character tool-call ids "
            "(this server's ids are 9 letters and digits)"
        )
    if "<|channel|>" in template:
        notes.append(
            "GPT-OSS calls written `<|channel|>commentary to=functions.NAME <|constrain|>json` (the model's habit) "
            "are read by this server's harmony parser, the template's own form by TRL's"
        )
    return notes


def _drops_earlier_reasoning(tokenizer: Any) -> bool:
    marker = "art_reasoning_probe_5c1e"
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": marker},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    try:
        final = tokenizer.apply_chat_template(messages[:2], tokenize=False)
        later = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that refuses the shape says nothing about reasoning
        return False
    return marker in str(final) and marker not in str(later)

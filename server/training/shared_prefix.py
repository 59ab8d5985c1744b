"""A micro-batch's shared prompt computed once: one forward pass over it, its KV cache repeated for every row.

In an agent's group (and across the groups of one task set) every sequence starts with the same system prompt
and tool list, often most of its tokens, and a forward pass per row computes it again for each. Here the rows'
common prefix runs once, batch 1, and each row's remainder attends to its keys and values, repeated across the
batch. The logits are the per-row pass's; in backward the repeated keys' and values' gradients are summed into
the one prefix pass, so the LoRA gradients are the per-row pass's too (equal to float rounding), and the prefix's
activations are kept once instead of once per row. The prefix ends before the first trained token, so no logit
of it is needed.

Not with activation checkpointing: transformers drops the cache inside a checkpointed layer, so the trainer
turns sharing off while checkpointing is on. Not with FSDP2 either, nor for a model with other layers than
attention (`sharing_for`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

# Below this many common tokens a second forward pass costs more (a pass's fixed per-layer cost) than it saves.
MIN_SHARED_TOKENS = 16
# Layers whose cache is keys and values alone, which repeating across the batch carries whole. A linear-attention
# layer (Qwen3-Next's, say) also keeps conv and recurrent states that transformers' batch repeat leaves as they are.
ATTENTION_LAYERS = {"full_attention", "sliding_attention"}


@dataclass(frozen=True)
class PrefixSharing:
    """What a shared prompt's pass needs: the keyword the model's forward takes a KV cache by (`cache` from
    transformers 5.2x, `past_key_values` before) and the module that pass goes through."""

    keyword: str
    model: Any


def sharing_for(model: Any, sharding: str | None) -> PrefixSharing | None:
    """How `model` (a PEFT model) shares prompts in a trainer process of `sharding`.

    None under FSDP2: every rank must run the same forward passes (each gathers parameters collectively), and
    one rank's micro-batch may share a prompt where another's does not. None for a model with layers other than
    attention (`ATTENTION_LAYERS`). Under DDP the prompt's pass goes through the model itself, not DDP's
    wrapper, whose every forward broadcasts buffers (a collective); the gradients it adds still reach DDP's
    hooks, which fire once per parameter per backward.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = set(getattr(base.config.get_text_config(), "layer_types", None) or ["full_attention"])
    if sharding == "fsdp" or not layers <= ATTENTION_LAYERS:
        return None
    keyword = "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"
    return PrefixSharing(keyword, model)


def shared_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, limit: int) -> int:
    """How many leading tokens every row has in common (unpadded), at most `limit`; 0 when not worth sharing."""
    if input_ids.shape[0] < 2 or limit < MIN_SHARED_TOKENS:
        return 0
    same = ((input_ids[:, :limit] == input_ids[:1, :limit]) & attention_mask[:, :limit].bool()).all(dim=0)
    differs = (~same).nonzero()
    length = int(differs[0]) if len(differs) else limit
    return length if length >= MIN_SHARED_TOKENS else 0


def logits(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    keep: int,
    sharing: PrefixSharing | None,
    prefix: int,
) -> torch.Tensor:
    """The last `keep` positions' logits; with `sharing` and `prefix` > 0, the first `prefix` tokens (the same in
    every row, none of their logits among those kept) are computed once."""
    kept = {"logits_to_keep": keep} if keep < input_ids.shape[1] else {}
    if sharing is None or not prefix:
        return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kept).logits
    head = sharing.model(
        input_ids=input_ids[:1, :prefix], attention_mask=attention_mask[:1, :prefix], use_cache=True, logits_to_keep=1
    )
    cache = getattr(head, sharing.keyword)  # the output field has the keyword's name
    cache.batch_repeat_interleave(input_ids.shape[0])
    rest = {sharing.keyword: cache, "use_cache": True, **kept}
    return model(input_ids=input_ids[:, prefix:], attention_mask=attention_mask, **rest).logits

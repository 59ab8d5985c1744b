"""GRPO loss variants (`grpo`, `dr_grpo`, `dapo`) over token-level logprobs; the knobs live in TrainConfig.

Per token t of sequence i (mask m, advantage A_i shared by the sequence):
    r = exp(logp - logp_old)                         importance ratio
    l = -min(r * A_i, clip(r, 1 - epsilon, 1 + clip_high) * A_i) + beta * kl
    kl = exp(logp_ref - logp) - (logp_ref - logp) - 1   (k3 estimator; logp_ref from the base model)
Aggregation (N sequences and T trained tokens in the whole step, so micro-batching changes nothing):
    grpo:    (1/N) * sum_i [ sum_t m*l / sum_t m ]
    dr_grpo: sum_{i,t} m*l / (N * max_completion_tokens)
    dapo:    sum_{i,t} m*l / T
`logp_old` is the policy at the start of the step (see trainer.py for why, and how it is obtained).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from art_agents.train_config import TrainConfig


@dataclass(frozen=True)
class BatchTotals:
    """Sizes of the whole step (not the micro-batch), the normalisers of every variant."""

    sequences: int
    tokens: int


def token_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each token given its prefix, and the logits that predicted it.

    Column j of the result is token j + 1 (token 0 has no prefix); callers shift the mask to match.
    """
    from trl.trainer.utils import selective_log_softmax

    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1].float()
    return selective_log_softmax(logits, input_ids[:, 1:]), logits


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: TrainConfig,
    totals: BatchTotals,
    ref_logps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step loss, and sums for the step's metrics.

    Shapes: logps, old_logps, ref_logps, mask (B, T); advantages (B,). Summing the returned loss over
    the micro-batches of a step gives the loss of the whole batch exactly.
    """
    import torch

    mask = mask.to(logps.dtype)
    adv = advantages.to(logps.dtype).unsqueeze(1)
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - config.epsilon, 1 + config.clip_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    kl = None
    if config.beta > 0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs ref_logps (the base model's logprobs)")
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + config.beta * kl
    masked = per_token * mask
    if config.loss == "grpo":
        loss = (masked.sum(1) / mask.sum(1).clamp(min=1.0)).sum() / totals.sequences
    elif config.loss == "dr_grpo":
        loss = masked.sum() / (totals.sequences * config.max_completion_tokens)
    elif config.loss == "dapo":
        loss = masked.sum() / max(totals.tokens, 1)
    else:
        raise ValueError(f"unknown loss {config.loss!r}; use grpo, dr_grpo or dapo")
    with torch.no_grad():
        was_clipped = ((ratio < 1 - config.epsilon) & (adv < 0)) | ((ratio > 1 + config.clip_high) & (adv > 0))
        sums = {"clipped_tokens": float((was_clipped.to(mask.dtype) * mask).sum())}
        if kl is not None:
            sums["kl_sum"] = float((kl * mask).sum())
    return loss, sums

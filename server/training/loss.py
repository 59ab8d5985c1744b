"""GRPO loss variants (`grpo`, `dr_grpo`, `dapo`, `cispo`) over token-level logprobs; the knobs live in TrainConfig.

Per token t of sequence i (mask m, advantage A_i shared by every sequence of its trajectory):
    logp = log_softmax(logits / temperature)[token]  the policy that sampled (temperature per token)
    r = exp(logp - logp_old)                         importance ratio (`token` level), or for every token of
        s = exp(sum_t m*(logp - logp_old) / sum_t m) sequence i at the `sequence` level (GSPO); (r + s) / 2 at
                                                     `average`, sqrt(r * s) at `geometric_average` (ART's)
    l = -min(r * A_i, clip(r, 1 - epsilon, 1 + clip_high) * A_i) * w + beta * kl * r + lambda * sg(logp - logp_T) * r
    cispo: l = -sg(min(r, epsilon_high)) * A_i * logp * w + beta * kl * r    (sg: no gradient through it)
    kl = exp(logp_ref - logp) - (logp_ref - logp) - 1   (k3 estimator; logp_ref: the base or `reference_step`)
    logp_T: the teacher's logprob of the token with the trajectory's hint in view (self_distill.py); lambda is
    `self_distill`, and the term is 0 on tokens without one. On-policy its value is the k1 estimate of the reverse
    KL(policy || teacher) and its gradient (logp - logp_T) * grad logp, the reverse KL's per token (as on-policy
    distillation: each token's own gap, no credit to later tokens).
    w = min(exp(logp_old - logp_sampler), tis_cap)  truncated importance sampling (1 without `tis_cap`)
    l = 0 where exp(logp_old - logp_sampler) is outside `icepop`'s [low, high] (IcePop's mask; off without it)
The KL term is weighted by r as in TRL (`use_bias_correction_kl`, DeepSeek-V3.2): its value is
unchanged on-policy, its gradient becomes the unbiased reverse-KL gradient.
Aggregation over the whole step (N trajectories, T trained tokens; L_j the trained tokens of
trajectory j over all its sequences), so neither micro-batching nor how a trajectory's turns
merged into sequences changes anything:
    grpo:    (1/N) * sum_j [ sum_{t in j} m*l / L_j ]      (TRL's per-sequence mean, per trajectory)
    dr_grpo: sum_{i,t} m*l / (N * max_completion_tokens)
    dapo, cispo: sum_{i,t} m*l / T
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

    trajectories: int
    tokens: int


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: TrainConfig,
    totals: BatchTotals,
    ref_logps: torch.Tensor | None = None,
    *,
    trajectory_tokens: torch.Tensor | None = None,
    sampler_logps: torch.Tensor | None = None,
    teacher_logps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step loss, and sums for the step's metrics.

    Shapes: logps, old_logps, ref_logps, sampler_logps, mask (B, T); advantages and
    trajectory_tokens (B,). `trajectory_tokens` defaults to each sequence's own trained tokens (one
    sequence per trajectory); `sampler_logps` (NaN where unknown) is only read with `tis_cap` or `icepop`,
    `teacher_logps` (NaN where a row has no hint) only with `self_distill`.
    Summing the returned loss over the micro-batches of a step gives the loss of the whole batch.
    """
    import torch

    mask = mask.to(logps.dtype)
    lengths = mask.sum(1) if trajectory_tokens is None else trajectory_tokens.to(logps.dtype)
    adv = advantages.to(logps.dtype).unsqueeze(1)
    ratio = _importance_ratio(logps - old_logps, mask, config.importance_sampling_level)
    if config.loss == "cispo":
        per_token = -torch.clamp(ratio, max=config.clip_high).detach() * adv * logps
    else:
        clipped = torch.clamp(ratio, 1 - config.epsilon, 1 + config.clip_high)
        per_token = -torch.min(ratio * adv, clipped * adv)
    outside = None
    if sampler_logps is not None and (config.tis_cap is not None or config.icepop is not None):
        with torch.no_grad():
            mismatch = torch.exp(old_logps - sampler_logps)  # NaN where the sampler's logprob is unknown
            if config.icepop is not None:
                outside = (mismatch < config.icepop[0]) | (mismatch > config.icepop[1])  # NaN: inside
        if config.tis_cap is not None:
            per_token = per_token * torch.nan_to_num(mismatch.clamp(max=config.tis_cap), nan=1.0)
    kl = None
    if config.beta > 0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs ref_logps (the base model's logprobs)")
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + config.beta * kl * ratio  # ratio-weighted: the unbiased reverse-KL gradient (TRL)
    gap = None
    if teacher_logps is not None and config.self_distill:
        hinted = torch.isfinite(teacher_logps)
        gap = torch.where(hinted, logps.detach() - torch.nan_to_num(teacher_logps), 0.0)
        per_token = per_token + config.self_distill * gap * ratio
    if outside is not None:
        per_token = per_token.masked_fill(outside, 0.0)
    masked = per_token * mask
    if config.loss == "grpo":
        loss = (masked.sum(1) / lengths.clamp(min=1.0)).sum() / totals.trajectories
    elif config.loss == "dr_grpo":
        loss = masked.sum() / (totals.trajectories * config.max_completion_tokens)
    elif config.loss in ("dapo", "cispo"):
        loss = masked.sum() / max(totals.tokens, 1)
    else:
        raise ValueError(f"unknown loss {config.loss!r}; use grpo, dr_grpo, dapo or cispo")
    with torch.no_grad():
        if config.loss == "cispo":  # capped weights (TRL's cispo_clip_ratio)
            was_clipped = (ratio > config.clip_high) & (adv > 0)
        else:
            was_clipped = ((ratio < 1 - config.epsilon) & (adv < 0)) | ((ratio > 1 + config.clip_high) & (adv > 0))
        was_clipped = was_clipped.expand_as(mask)
        sums = {"clipped_tokens": float((was_clipped.to(mask.dtype) * mask).sum())}
        if kl is not None:
            sums["kl_sum"] = float((kl * mask).sum())
        if gap is not None:
            sums["distill_gap_sum"] = float((gap * mask).sum())
            sums["hinted_tokens"] = float((hinted.to(mask.dtype) * mask).sum())
        if outside is not None:
            sums["masked_tokens"] = float((outside.to(mask.dtype) * mask).sum())
    return loss, sums


def _importance_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    import torch

    if level == "token":
        return torch.exp(log_ratio)
    sequence = (log_ratio * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
    if level == "sequence":
        return torch.exp(sequence)
    if level == "average":
        return (torch.exp(log_ratio) + torch.exp(sequence)) / 2
    if level == "geometric_average":
        return torch.exp((log_ratio + sequence) / 2)
    raise ValueError(f"unknown importance_sampling_level {level!r}; use token, sequence, average or geometric_average")

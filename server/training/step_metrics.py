"""Metrics of the policy at the start of a step, from its first forward pass: what it was trained from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from art_agents.server.training.logprobs import ScaledLogits


def first_pass_sums(
    sums: dict[str, float], batch: dict[str, Any], old_logps: torch.Tensor, logits: ScaledLogits
) -> float:
    """Metrics of the policy at the start of the step: entropy of the trained tokens, distance to the sampler;
    returns the largest |logprob gap| to the sampler of this micro-batch.

    `kl_sampler` is KL(sampler || policy) by the k3 estimator on the sampled tokens: near 0 on policy,
    growing with staleness or an engine whose numbers differ from the trainer's.
    """
    import torch

    with torch.no_grad():
        mask = batch["mask"]
        sums["entropy_sum"] += logits.entropy_sum(mask)
        sampler = batch["sampler_logprobs"]
        known = mask & torch.isfinite(sampler)
        delta = old_logps[known] - sampler[known]
        sums["gap_sum"] += float(delta.abs().sum())
        sums["gap_kl_sum"] += float((torch.exp(delta) - delta - 1).sum())
        sums["gap_tokens"] += float(known.sum())
        return float(delta.abs().max()) if delta.numel() else 0.0

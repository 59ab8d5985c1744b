"""Token logprobs of a forward pass without full-vocabulary fp32 copies kept alive for backward.

`log_softmax(logits.float() / T)[token]` written out keeps a (batch, tokens, vocabulary) fp32 tensor until
backward (the scaled logits that log-sum-exp needs) and briefly two more (the upcast and the scaled copy),
beside the model's own logits: on a 150k-token vocabulary that is most of a step's peak memory. Here only
the model's logits (which exist anyway) and one log-sum-exp per position are kept; the softmax is
recomputed a chunk of positions at a time in backward. Values and gradients are the written-out formula's,
computed in fp32 whatever the logits' dtype.

Given the mask of the tokens that train, the model computes logits only from the first of them on
(`logits_to_keep`): an agent's sequence is mostly prompt (system prompt, tools, tool results), and the
language-model head over a large vocabulary is a large share of a forward pass's time and memory. Given a
`PrefixSharing`, the rows' common prompt runs once (training/shared_prefix.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from art_agents.server.training import shared_prefix

# fp32 elements of one chunk of scaled logits (64 MiB): positions per chunk = this // vocabulary size.
CHUNK_ELEMENTS = 1 << 24


def _chunks(logits: torch.Tensor) -> Iterator[tuple[int, slice]]:
    """(row, positions) of every chunk; views of `logits`, never a copy of it."""
    size = max(1, CHUNK_ELEMENTS // logits.shape[-1])
    for row in range(logits.shape[0]):
        for start in range(0, logits.shape[1], size):
            yield row, slice(start, start + size)


def _scaled(logits: torch.Tensor, temperatures: torch.Tensor, row: int, positions: slice) -> torch.Tensor:
    return logits[row, positions].float() / temperatures[row, positions].unsqueeze(-1)


class _SelectedLogprobs(torch.autograd.Function):
    """log_softmax(logits / T) at `targets`, saving the logits and the log-sum-exp only."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        lse = torch.empty(targets.shape, dtype=torch.float32, device=logits.device)
        selected = torch.empty_like(lse)
        for row, positions in _chunks(logits):
            scaled = _scaled(logits, temperatures, row, positions)
            lse[row, positions] = torch.logsumexp(scaled, dim=-1)
            selected[row, positions] = scaled.gather(-1, targets[row, positions].unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(logits, targets, temperatures, lse)
        return selected - lse

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        logits, targets, temperatures, lse = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        for row, positions in _chunks(logits):
            g = grad[row, positions].float().unsqueeze(-1)
            scaled_grad = -torch.exp(_scaled(logits, temperatures, row, positions) - lse[row, positions].unsqueeze(-1))
            scaled_grad.mul_(g).scatter_add_(-1, targets[row, positions].unsqueeze(-1), g)
            grad_logits[row, positions] = scaled_grad / temperatures[row, positions].unsqueeze(-1)
        return grad_logits, None, None


@dataclass
class ScaledLogits:
    """The logits a step scored with and the temperature of each position, for metrics after the fact; they begin
    at column `start` of the logprobs (none were computed before the first trained token)."""

    logits: torch.Tensor
    temperatures: torch.Tensor
    start: int = 0

    def entropy_sum(self, mask: torch.Tensor) -> float:
        """Sum of the entropies of the masked positions' tempered distributions, a chunk at a time."""
        total = 0.0
        mask = mask[:, self.start :]
        with torch.no_grad():
            for row, positions in _chunks(self.logits):
                kept = mask[row, positions]
                if kept.any():
                    scaled = _scaled(self.logits, self.temperatures, row, positions)[kept]
                    logp = torch.log_softmax(scaled, dim=-1)
                    total -= float((logp.exp() * logp).sum())
        return total


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperatures: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    sharing: shared_prefix.PrefixSharing | None = None,
) -> tuple[torch.Tensor, ScaledLogits]:
    """Logprob of each token given its prefix at its sampling temperature, and what it was computed from.

    Column j of the result is token j + 1 (token 0 has no prefix); callers shift the mask and
    `temperatures` (B, T - 1, the temperature token j + 1 was sampled at) to match. With `mask` (those
    columns' trained tokens), columns before the first trained one in any row are 0, not computed. With
    `sharing` the tokens every row shares before that column are computed once.
    """
    width = input_ids.shape[1] - 1
    start = _first_trained(mask) if mask is not None else 0
    prefix = shared_prefix.shared_length(input_ids, attention_mask, start) if sharing else 0
    logits = shared_prefix.logits(model, input_ids, attention_mask, width + 1 - start, sharing, prefix)[:, :-1]
    if temperatures is None:
        temperatures = torch.ones((input_ids.shape[0], width), dtype=torch.float32, device=logits.device)
    temperatures = temperatures[:, start:]
    selected = _SelectedLogprobs.apply(logits, input_ids[:, start + 1 :], temperatures)
    logps = torch.nn.functional.pad(selected, (start, 0)) if start else selected
    return logps, ScaledLogits(logits.detach(), temperatures, start)


def _first_trained(mask: torch.Tensor) -> int:
    """The first column any row trains (0 when none does)."""
    columns = mask.any(dim=0).nonzero()
    return int(columns[0]) if len(columns) else 0

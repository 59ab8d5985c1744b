"""Sampling a batch of rows, each with its own temperature, top-p and random stream, without sorting the vocabulary.

Each row draws one uniform number per token from its own `random.Random` and picks the token by
inverting its cumulative distribution, so a seeded row samples the same tokens whatever rows share
its batch (torch's generators tie a draw to tensor shapes and devices; one float per token does
not). Top-p looks at the `TOP_K_CANDIDATES` most likely tokens first and sorts the whole vocabulary
only for a row whose nucleus is wider than that (a flat distribution). The settings arrive as Python
lists, so the common batch (every row sampled, no top-p) takes the shortest path without a branch
on the device.
"""

from __future__ import annotations

import random
from typing import Any

TOP_K_CANDIDATES = 64


def row_random(seed: int | None) -> random.Random:
    """A row's random stream: from its seed, or from the OS's entropy when unseeded."""
    return random.Random(seed) if seed is not None else random.Random()


def sample(
    logits: Any, temperatures: list[float], top_ps: list[float], uniforms: list[float]
) -> tuple[list[int], list[float]]:
    """Per row of `logits` [rows, vocab]: the token (argmax where the temperature is 0, else drawn from
    softmax(logits / temperature) within the top-p nucleus) and its logprob, log softmax(logits / basis)
    with basis the temperature (1 for greedy): the logprob the trainer recomputes, untruncated by top-p."""
    import torch

    basis = [t if t > 0 else 1.0 for t in temperatures]
    if len(set(basis)) == 1:
        scaled = logits / basis[0] if basis[0] != 1.0 else logits
    else:
        scaled = logits / torch.tensor(basis, device=logits.device)[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)
    drawn = [i for i, t in enumerate(temperatures) if t > 0]
    if len(drawn) == len(temperatures):
        chosen = _draw(logprobs.exp(), top_ps, uniforms)
    else:
        chosen = logits.argmax(dim=-1)
        if drawn:
            index = torch.tensor(drawn, device=logits.device)
            chosen[index] = _draw(logprobs[index].exp(), [top_ps[i] for i in drawn], [uniforms[i] for i in drawn])
    return chosen.tolist(), logprobs.gather(1, chosen[:, None])[:, 0].tolist()


def _draw(probs: Any, top_ps: list[float], uniforms: list[float]) -> Any:
    import torch

    draws = torch.tensor(uniforms, dtype=torch.float64, device=probs.device)
    if all(p >= 1 for p in top_ps):
        return _invert(probs, draws)
    chosen = torch.empty(len(top_ps), dtype=torch.long, device=probs.device)
    full = [i for i, p in enumerate(top_ps) if p >= 1]
    if full:
        index = torch.tensor(full, device=probs.device)
        chosen[index] = _invert(probs[index], draws[index])
    narrowed = [i for i, p in enumerate(top_ps) if p < 1]
    index = torch.tensor(narrowed, device=probs.device)
    limits = torch.tensor([top_ps[i] for i in narrowed], device=probs.device)
    candidates, ids = probs[index].topk(min(TOP_K_CANDIDATES, probs.shape[-1]), dim=-1)
    picks = _invert(_nucleus(candidates, limits), draws[index])
    chosen[index] = ids.gather(1, picks[:, None])[:, 0]
    for k in (candidates.sum(-1) < limits).nonzero()[:, 0].tolist():  # nucleus wider than the candidates
        row = narrowed[k]
        ordered, order = probs[row].sort(descending=True)
        pick = _invert(_nucleus(ordered[None], limits[k : k + 1]), draws[row : row + 1])
        chosen[row] = order[pick[0]]
    return chosen


def _nucleus(ordered: Any, top_p: Any) -> Any:
    """Descending probabilities with those outside each row's top-p nucleus zeroed (the top token always stays)."""
    import torch

    inside = (ordered.cumsum(-1) - ordered) < top_p[:, None]
    return torch.where(inside, ordered, torch.zeros_like(ordered))


def _invert(weights: Any, draws: Any) -> Any:
    """Per row, the index whose cumulative weight first exceeds `draw * total` (a zero weight never wins)."""
    import torch

    cdf = weights.double().cumsum(-1)
    picks = torch.searchsorted(cdf, draws[:, None] * cdf[:, -1:], right=True)[:, 0]
    return picks.clamp(max=weights.shape[-1] - 1)

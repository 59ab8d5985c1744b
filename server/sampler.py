"""Sampling a batch of rows, each with its own temperature, top-p and random stream, without sorting the vocabulary.

Each row draws one uniform number per token from its own `random.Random` and picks the token by
inverting its cumulative distribution, so a seeded row samples the same tokens whatever rows share
its batch (torch's generators tie a draw to tensor shapes and devices; one float per token does
not). Top-p looks at the `TOP_K_CANDIDATES` most likely tokens first and sorts the whole vocabulary
only for a row whose nucleus is wider than that (a flat distribution).
"""

from __future__ import annotations

import random
from typing import Any

TOP_K_CANDIDATES = 64


def row_random(seed: int | None) -> random.Random:
    """A row's random stream: from its seed, or from the OS's entropy when unseeded."""
    return random.Random(seed) if seed is not None else random.Random()


def _invert(weights: Any, uniforms: Any) -> Any:
    """Per row, the index whose cumulative weight first exceeds `uniform * total` (zero weights never win)."""
    import torch

    cdf = weights.double().cumsum(-1)
    targets = uniforms.double()[:, None] * cdf[:, -1:]
    picks = torch.searchsorted(cdf, targets, right=True)[:, 0]
    return picks.clamp(max=weights.shape[-1] - 1)


def _nucleus(probs: Any, top_p: Any, uniforms: Any) -> Any:
    """Top-p sampling over each row's candidates, sorted descending; keeps at least the top token."""
    import torch

    cumulative = probs.cumsum(-1)
    inside = (cumulative - probs) < top_p[:, None]
    return _invert(torch.where(inside, probs, torch.zeros_like(probs)), uniforms)


def sample_tokens(logits: Any, temperature: Any, top_p: Any, uniforms: Any) -> Any:
    """One token id per row of `logits` [rows, vocab]: argmax where temperature is 0, else a draw
    from softmax(logits / temperature) restricted to the top-p nucleus."""
    import torch

    chosen = logits.argmax(dim=-1)
    drawn = temperature > 0
    if not bool(drawn.any()):
        return chosen
    probs = torch.softmax(logits / temperature.clamp(min=1e-5)[:, None], dim=-1)
    full = (drawn & (top_p >= 1)).nonzero()[:, 0]
    if len(full):
        chosen[full] = _invert(probs[full], uniforms[full])
    narrowed = (drawn & (top_p < 1)).nonzero()[:, 0]
    if len(narrowed):
        candidates, ids = probs[narrowed].topk(min(TOP_K_CANDIDATES, probs.shape[-1]), dim=-1)
        picks = _nucleus(candidates, top_p[narrowed], uniforms[narrowed])
        chosen[narrowed] = ids.gather(1, picks[:, None])[:, 0]
        wide = candidates.sum(-1) < top_p[narrowed]  # the nucleus reaches past the candidates: sort it all
        for row in narrowed[wide].tolist():
            ordered, order = probs[row].sort(descending=True)
            pick = _nucleus(ordered[None], top_p[row : row + 1], uniforms[row : row + 1])
            chosen[row] = order[pick[0]]
    return chosen


def token_logprobs(logits: Any, tokens: Any, basis: Any) -> Any:
    """log softmax(logits / basis)[token] per row: the logprob the trainer recomputes for that token."""
    import torch

    scaled = logits / basis[:, None]
    return scaled.gather(1, tokens[:, None])[:, 0] - torch.logsumexp(scaled, dim=-1)

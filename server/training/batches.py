"""Micro-batches of training sequences: grouped by length, padded into tensors."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from art_agents.server.training.sequences import TrainSequence

if TYPE_CHECKING:
    import torch


def chunks(sequences: list[TrainSequence], size: int, tokens: int | None = None) -> list[list[TrainSequence]]:
    """Micro-batches of similar length (sorted longest first, so padding stays small) of at most `size` sequences
    and, when `tokens` is set, at most `tokens` padded tokens (the first, longest sequence sets the width)."""
    ordered = sorted(sequences, key=lambda s: len(s.token_ids), reverse=True)
    chunks: list[list[TrainSequence]] = []
    for sequence in ordered:
        last = chunks[-1] if chunks else []
        if last and len(last) < size and (tokens is None or (len(last) + 1) * len(last[0].token_ids) <= tokens):
            last.append(sequence)
        else:
            chunks.append([sequence])
    return chunks


def collate(chunk: list[TrainSequence], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded tensors; `mask` and `sampler_logprobs` are shifted to align with next-token logprobs."""
    import torch

    width = max(len(s.token_ids) for s in chunk)

    def padded(values: list, fill: Any) -> list:
        return values + [fill] * (width - len(values))

    input_ids = torch.tensor([padded(s.token_ids, pad_id) for s in chunk], device=device)
    attention = torch.tensor([padded([1] * len(s.token_ids), 0) for s in chunk], device=device)
    mask = torch.tensor([padded(s.mask, False) for s in chunk], device=device)[:, 1:]
    sampler = torch.tensor([padded(s.sampler_logprobs, math.nan) for s in chunk], dtype=torch.float32, device=device)
    temperatures = torch.tensor([padded(s.temperatures, 1.0) for s in chunk], dtype=torch.float32, device=device)
    advantages = torch.tensor([s.advantage for s in chunk], dtype=torch.float32, device=device)
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "mask": mask,
        "sampler_logprobs": sampler[:, 1:],
        "temperatures": temperatures[:, 1:],
        "advantages": advantages,
        "trajectory_tokens": torch.tensor([s.trajectory_tokens for s in chunk], dtype=torch.float32, device=device),
    }


def empty_sequence(pad_id: int) -> TrainSequence:
    """A sequence with nothing to train: the forward pass of a rank whose share of a step ran out."""
    return TrainSequence(token_ids=[pad_id, pad_id], mask=[False, False], sampler_logprobs=[math.nan] * 2)

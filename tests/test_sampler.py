"""The sampler draws exactly from the tempered, top-p-narrowed distribution, without sorting the vocabulary."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from art_agents.server.engines.sampler import TOP_K_CANDIDATES, row_random, sample

DRAWS = 2000


def draw(probs: list[float], temperature: float = 1.0, top_p: float = 1.0) -> collections.Counter[int]:
    """Tokens drawn with evenly spread uniforms: each token's count is its probability x DRAWS, to rounding."""
    logits = torch.tensor(probs).log().repeat(DRAWS, 1) * temperature
    uniforms = [(i + 0.5) / DRAWS for i in range(DRAWS)]
    tokens, _ = sample(logits, [temperature] * DRAWS, [top_p] * DRAWS, uniforms)
    return collections.Counter(tokens)


def test_draws_follow_the_tempered_distribution() -> None:
    probs = [0.1, 0.0, 0.6, 0.3]
    counts = draw(probs, temperature=0.7)  # logits scaled by 0.7, then divided by it: the same distribution
    assert counts == {0: 200, 2: 1200, 3: 600}  # a zero-probability token is never drawn


def test_top_p_keeps_the_smallest_set_reaching_p_and_renormalises() -> None:
    counts = draw([0.05, 0.5, 0.15, 0.3], top_p=0.8)
    assert counts == {1: 1250, 3: 750}  # 0.5 + 0.3 reaches 0.8; the rest never drawn
    assert draw([0.05, 0.5, 0.15, 0.3], top_p=0.01) == {1: DRAWS}  # the top token always stays


def test_a_nucleus_wider_than_the_candidates_is_sampled_over_the_whole_vocabulary() -> None:
    vocab = 4 * TOP_K_CANDIDATES
    probs = [2.0 if i < 10 else 1.0 for i in range(vocab)]
    total = sum(probs)
    counts = draw([p / total for p in probs], top_p=0.9)
    assert len(counts) > TOP_K_CANDIDATES
    assert sum(counts[i] for i in range(10)) == pytest.approx(DRAWS * 20 / (0.9 * total), abs=DRAWS * 0.02)


def test_greedy_rows_take_the_argmax_beside_sampled_rows_with_logprobs_at_their_temperature() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0], [0.5, 2.0, -1.0]])
    tokens, logprobs = sample(logits, [0.0, 1.0, 0.6], [1.0, 1.0, 0.9], [0.99, 0.99, 0.0])
    assert tokens == [1, 2, 1]  # u = 0.99 lands in the last token's share; u = 0 on the most likely
    expected = [
        torch.log_softmax(logits[0], dim=-1)[1],  # greedy: at temperature 1
        torch.log_softmax(logits[1], dim=-1)[2],
        torch.log_softmax(logits[2] / 0.6, dim=-1)[1],  # at the sampling temperature, before top-p
    ]
    assert logprobs == pytest.approx([float(e) for e in expected], abs=1e-6)


def test_a_seeded_row_stream_repeats_and_unseeded_ones_differ() -> None:
    assert [row_random(3).random() for _ in range(2)] == [row_random(3).random() for _ in range(2)]
    assert not math.isclose(row_random(None).random(), row_random(None).random())

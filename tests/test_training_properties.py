"""Property tests: turn merging never drops or duplicates a sampled token; kept advantages sum to zero."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from art_agents.server.training.advantages import group_advantages
from art_agents.server.training.sequences import _TurnTokens, merge_turns
from art_agents.trajectory import Trajectory, TrajectoryGroup

tokens = st.lists(st.integers(0, 50), min_size=1, max_size=6)


@st.composite
def rollouts(draw: st.DrawFn) -> list[_TurnTokens]:
    """Turns whose prompts either continue an earlier turn's history (+ tool/user tokens) or start afresh."""
    histories: list[list[int]] = []
    turns = []
    for _ in range(draw(st.integers(1, 8))):
        if histories and draw(st.booleans()):
            base = histories[draw(st.integers(0, len(histories) - 1))]
            prompt = base + draw(st.lists(st.integers(51, 60), max_size=3))
        else:
            prompt = [99, *draw(tokens)]  # a different first token: a fresh conversation
        completion = draw(tokens)
        turns.append(_TurnTokens(prompt, completion, [-1.0] * len(completion), f"turn-{len(turns)}"))
        histories.append(prompt + completion)
    return turns


@settings(max_examples=300, deadline=None)
@given(rollouts())
def test_merging_keeps_every_sampled_token_exactly_once(turns: list[_TurnTokens]) -> None:
    sequences = merge_turns(turns)
    by_id = {turn.completion_id: turn for turn in turns}
    owners = [cid for sequence in sequences for cid in sequence.completion_ids]
    assert sorted(owners) == sorted(by_id)  # every turn lands in exactly one sequence
    for sequence in sequences:
        assert len(sequence.token_ids) == len(sequence.mask) == len(sequence.sampler_logprobs)
        trained = [t for t, m in zip(sequence.token_ids, sequence.mask, strict=True) if m]
        assert trained == [t for cid in sequence.completion_ids for t in by_id[cid].completion]  # in order, once
        for cid in sequence.completion_ids:  # and each turn's prompt is what precedes its completion
            assert sequence.token_ids[: len(by_id[cid].prompt_ids)] == by_id[cid].prompt_ids


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=8), min_size=1, max_size=6),
    st.booleans(),
)
def test_advantages_of_a_kept_group_sum_to_zero(rewards: list[list[float]], scale: bool) -> None:
    groups = [TrajectoryGroup(Trajectory(reward=r) for r in group) for group in rewards]
    result = group_advantages(groups, scale_rewards=scale, min_group_std=1e-6)
    assert sorted([*result.kept, *result.skipped]) == list(range(len(groups)))
    for g in result.kept:
        values = [result.values[(g, t)] for t in range(len(rewards[g]))]
        assert math.isclose(sum(values), 0.0, abs_tol=1e-6 * max(1.0, max(map(abs, rewards[g]))) * len(values))
    for g in result.skipped:
        assert len(rewards[g]) == 1 or max(rewards[g]) - min(rewards[g]) < 1e-5

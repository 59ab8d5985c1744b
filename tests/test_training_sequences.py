"""Sequences from trajectories: exact store tokens, merging by tokens, masks, shared advantages."""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
import torch
from trl_reference import trl_nanstd

from art_agents.capture import record_completion
from art_agents.server.models.chat_format import parse_assistant, render_prompt_ids
from art_agents.server.storage.token_store import TokenRecord, TokenStore
from art_agents.server.training.advantages import group_advantages
from art_agents.server.training.sequences import TrainingInputError, build_sequences
from art_agents.trajectory import Trajectory, TrajectoryGroup

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]


def call(trajectory: Trajectory, store: TokenStore, tokenizer: Any, request: list[dict], text: str) -> dict:
    """What the server does for one completion: render the prompt, 'sample' `text`, store the tokens."""
    prompt = render_prompt_ids(tokenizer, request, TOOLS)
    completion = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    logprobs = [-0.1 * (i + 1) for i in range(len(completion))]
    store.add(
        TokenRecord(
            completion_id=cid, model="m", policy_step=0, prompt_ids=prompt, completion_ids=completion, logprobs=logprobs
        )
    )
    message = parse_assistant(tokenizer, text)
    record_completion(request, message, tools=TOOLS, completion_id=cid, model="m@0", trajectory=trajectory)
    return message


def tool_loop(store: TokenStore, tokenizer: Any, reward: float = 1.0) -> Trajectory:
    """Three calls: add, add again with the tool result, then the answer (one growing conversation)."""
    trajectory = Trajectory(reward=reward)
    messages: list[dict] = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "1+2+3?"}]
    for k, text in enumerate(
        [
            '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
            '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 3}}\n</tool_call>',
            "The answer is 6.",
        ]
    ):
        message = call(trajectory, store, tokenizer, messages, text)
        messages.append(message)
        if k < 2:
            messages.append(
                {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": str(3 * (k + 1))}
            )
    return trajectory


def trained(sequence) -> list[int]:
    return [t for t, m in zip(sequence.token_ids, sequence.mask, strict=True) if m]


def test_three_turn_tool_loop_is_one_merged_sequence(store: TokenStore, tokenizer: Any) -> None:
    trajectory = tool_loop(store, tokenizer)
    assert len(trajectory.turns) == 3 and not trajectory.additional_histories
    sequences, stats = build_sequences([TrajectoryGroup([trajectory])], store, tokenizer)
    assert len(sequences) == 1
    [sequence] = sequences
    records = [store.get(turn.completion_id) for turn in trajectory.turns]
    # the trained tokens are exactly the sampled completions, in order, and nothing else
    assert trained(sequence) == [t for r in records for t in r.completion_ids]
    assert sequence.token_ids == records[-1].prompt_ids + records[-1].completion_ids
    assert sequence.sampler_logprobs[-len(records[-1].logprobs) :] == records[-1].logprobs
    # the tool results between the calls are in the sequence but masked
    untrained = tokenizer.decode([t for t, m in zip(sequence.token_ids, sequence.mask, strict=True) if not m])
    assert "<tool_response>\n3\n</tool_response>" in untrained and "You add numbers." in untrained
    assert stats.turns_from_store == 3 and stats.turns_retokenized == 0


def test_rewritten_history_trains_as_separate_sequences(store: TokenStore, tokenizer: Any) -> None:
    trajectory = Trajectory(reward=1.0)
    first = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "1+2?"}]
    answer = call(trajectory, store, tokenizer, first, "It is 3.")
    # the agent summarises the conversation before its next call: the new prompt does not extend the old one
    summary = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "Earlier: 1+2=3. Now 3+3?"},
    ]
    call(trajectory, store, tokenizer, summary, "It is 6.")
    assert answer["content"] == "It is 3."
    assert len(trajectory.additional_histories) == 1  # the client saw the rewrite too
    sequences, _ = build_sequences([TrajectoryGroup([trajectory])], store, tokenizer)
    assert len(sequences) == 2
    for sequence, turn in zip(sequences, trajectory.turns, strict=True):
        record = store.get(turn.completion_id)
        assert sequence.token_ids == record.prompt_ids + record.completion_ids
        assert trained(sequence) == record.completion_ids


def test_every_sequence_of_a_trajectory_shares_its_advantage(store: TokenStore, tokenizer: Any) -> None:
    rewritten = Trajectory(reward=0.0)
    call(rewritten, store, tokenizer, [{"role": "user", "content": "a"}], "x")
    call(rewritten, store, tokenizer, [{"role": "user", "content": "b"}], "y")
    groups = [TrajectoryGroup([tool_loop(store, tokenizer, reward=1.0), rewritten])]
    advantages = group_advantages(groups, scale_rewards=True, min_group_std=1e-6)
    sequences, _ = build_sequences(groups, store, tokenizer, advantages.values, advantages.kept)
    assert [s.trajectory for s in sequences] == [0, 1, 1]
    assert [s.advantage for s in sequences] == pytest.approx([0.7070, -0.7070, -0.7070], abs=1e-4)
    assert [s.trajectory_tokens for s in sequences] == [sequences[0].trained_tokens] + [
        sequences[1].trained_tokens + sequences[2].trained_tokens
    ] * 2  # a trajectory's weight counts its tokens over all its sequences


def test_unknown_completion_id_is_named(store: TokenStore, tokenizer: Any) -> None:
    trajectory = tool_loop(store, tokenizer)
    trajectory.turns[1].completion_id = "chatcmpl-not-here"
    with pytest.raises(TrainingInputError, match="chatcmpl-not-here"):
        build_sequences([TrajectoryGroup([trajectory])], store, tokenizer)


def test_turn_without_completion_id_is_retokenized_and_counted(store: TokenStore, tokenizer: Any) -> None:
    trajectory = tool_loop(store, tokenizer)
    for turn in trajectory.turns:
        turn.completion_id = None
    sequences, stats = build_sequences([TrajectoryGroup([trajectory])], store, tokenizer)
    assert stats.turns_retokenized == 3 and stats.turns_from_store == 0
    assert sequences and all(
        math.isnan(x) for s in sequences for x, m in zip(s.sampler_logprobs, s.mask, strict=True) if m
    )
    text = tokenizer.decode(trained(sequences[-1]))
    assert text.endswith("The answer is 6.<|im_end|>")


def test_zero_variance_groups_are_skipped_and_std_scaling_is_optional(store: TokenStore, tokenizer: Any) -> None:
    flat = TrajectoryGroup([Trajectory(reward=0.5), Trajectory(reward=0.5)])
    spread = TrajectoryGroup([Trajectory(reward=0.0), Trajectory(reward=1.0), Trajectory(reward=2.0)])
    scaled = group_advantages([flat, spread], scale_rewards=True, min_group_std=1e-6)
    assert scaled.skipped == [0] and scaled.kept == {1}
    rewards = torch.tensor([0.0, 1.0, 2.0])
    expected = (rewards - rewards.mean()) / (trl_nanstd(rewards) + 1e-4)  # TRL's own std: n - 1, and its epsilon
    assert [scaled.values[(1, t)] for t in range(3)] == pytest.approx(expected.tolist(), abs=1e-6)
    tiny = group_advantages([TrajectoryGroup([Trajectory(reward=0.0), Trajectory(reward=1e-5)])], scale_rewards=True,
                            min_group_std=1e-6)  # fmt: skip
    assert abs(tiny.values[(0, 0)]) < 0.1  # a reward difference of 1e-5 is not a +-0.7 advantage
    unscaled = group_advantages([flat, spread], scale_rewards=False, min_group_std=1e-6)
    assert [unscaled.values[(1, t)] for t in range(3)] == pytest.approx([-1.0, 0.0, 1.0])

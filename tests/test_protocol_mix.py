"""Training is the same whichever protocol sampled: multi-turn agents on Chat, Responses, Anthropic Messages and
Completions, captured inside `art.rollout()`, each reuse their earlier turns from the prefix cache, train on the
exact tokens served, and mix in one group."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

import art_agents as art
from art_agents import RemoteBackend, TrainableModel, TrainConfig, TrajectoryGroup

HEAD = "You are a careful agent. " + " ".join(f"Rule {i}: answer briefly about topic {i}." for i in range(12))
TURNS = ["First question?", "And the second?", "One more, please."]
SAMPLING = {"temperature": 0.8}
Conversation = Callable[[TrainableModel, str], Awaitable[None]]


async def chat(model: TrainableModel, server: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x")
    messages: list[dict[str, Any]] = [{"role": "system", "content": HEAD}]
    for text in TURNS:
        messages.append({"role": "user", "content": text})
        reply = await client.chat.completions.create(model=model.name, messages=messages, max_tokens=8, **SAMPLING)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})


async def responses(model: TrainableModel, server: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x")
    items: list[Any] = []
    for text in TURNS:
        items.append({"role": "user", "content": text})
        reply = await client.responses.create(
            model=model.name, instructions=HEAD, input=items, max_output_tokens=8, **SAMPLING
        )
        items += [item.model_dump(exclude_none=True) for item in reply.output]


async def messages(model: TrainableModel, server: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=server, api_key="x")
    turns: list[dict[str, Any]] = []
    for text in TURNS:
        turns.append({"role": "user", "content": text})
        reply = await client.messages.create(
            model=model.name, system=HEAD, messages=turns, max_tokens=8, extra_body=SAMPLING
        )
        turns.append({"role": "assistant", "content": [block.model_dump() for block in reply.content]})


async def completions(model: TrainableModel, server: str) -> None:
    """Token ids in, as a completions agent that keeps its own transcript does: each prompt extends the last."""
    client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x")
    prompt = _ids(model, HEAD)
    for text in TURNS:
        prompt += _ids(model, f"\n{text}\n")
        reply = await client.completions.create(model=model.name, prompt=prompt, max_tokens=8, **SAMPLING)
        prompt += reply.choices[0].model_extra["token_ids"]


def _ids(model: TrainableModel, text: str) -> list[int]:
    return _tokenizer(model.base_model).encode(text, add_special_tokens=False)


@functools.cache
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


PROTOCOLS: dict[str, Conversation] = {
    "chat": chat,
    "responses": responses,
    "messages": messages,
    "completions": completions,
}


async def rollout(model: TrainableModel, server: str, protocol: str, reward: float) -> art.Trajectory:
    async with art.rollout(protocol=protocol) as trajectory:
        await PROTOCOLS[protocol](model, server)
        trajectory.reward = reward
    return trajectory


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
async def test_a_multi_turn_agent_reuses_its_turns_and_trains_on_what_was_served(
    server: str, backend: RemoteBackend, tiny_model_path: Path, protocol: str
) -> None:
    model = TrainableModel(name=f"mix-{protocol}", project="tests", base_model=str(tiny_model_path))
    await model.register(backend)
    group = TrajectoryGroup([await rollout(model, server, protocol, float(r)) for r in range(2)])
    assert all(len(t.turns) == 3 and all(turn.completion_id for turn in t.turns) for t in group.trajectories)
    result = await model.train([group], TrainConfig(), progress=False)
    assert result.metrics["turns_from_store"] == 6 and result.metrics["turns_retokenized"] == 0
    assert result.metrics["prefix_cache_hit_rate"] > 0.5  # later turns, and the second rollout's head, came cached
    assert result.metrics["logprob_gap_sampler"] < 1e-5


async def test_a_group_mixing_the_four_protocols_trains_one_step(
    server: str, backend: RemoteBackend, tiny_model_path: Path
) -> None:
    model = TrainableModel(name="mix-all", project="tests", base_model=str(tiny_model_path))
    await model.register(backend)
    group = TrajectoryGroup([await rollout(model, server, p, float(i)) for i, p in enumerate(PROTOCOLS)])
    result = await model.train([group], TrainConfig(), progress=False)
    assert result.step == 1 and result.metrics["turns_from_store"] == 12 and result.metrics["turns_retokenized"] == 0
    reply = await openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x").responses.create(
        model=model.name, input="hi", max_output_tokens=2
    )
    assert reply.model == "mix-all@1"

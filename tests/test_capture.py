"""Capture records exactly the calls made inside a rollout, through the real OpenAI SDK."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

import art_agents
from art_agents import Model, Trajectory, rollout
from art_agents.wire import ROLLOUT_HEADER

TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}}


def model_for(server) -> Model:
    return Model(name="agent", inference_base_url=server.base_url)


async def test_records_calls_in_order_with_tool_calls_and_streaming(scripted) -> None:
    scripted.replies = [{"content": None, "tool_calls": [CALL]}, "three"]
    client = model_for(scripted).openai_client()
    messages: list[dict] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "1+2?"}]
    async with rollout(task="add") as traj:
        first = await client.chat.completions.create(model="agent", messages=messages, tools=[TOOL])
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        ]
        stream = await client.chat.completions.create(model="agent", messages=messages, stream=True)
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    assert text == "three"
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.messages[2].tool_calls[0].function.name == "add"
    assert traj.messages[4].content == "three"
    assert traj.tools == [TOOL]
    assert [(t.history, t.index, t.completion_id, t.model, t.policy_step) for t in traj.turns] == [
        (0, 2, "chatcmpl-0", "agent@0", 0),
        (0, 4, "chatcmpl-1", "agent@0", 0),
    ]
    assert traj.turns[1].finish_reason == "stop"
    assert traj.metadata == {"task": "add"}
    assert scripted.headers[0][ROLLOUT_HEADER] == traj.id


async def test_streamed_tool_calls_are_assembled(scripted) -> None:
    scripted.replies = [{"content": "", "tool_calls": [CALL]}]
    client = model_for(scripted).openai_client()
    async with rollout() as traj:
        stream = await client.chat.completions.create(
            model="agent", messages=[{"role": "user", "content": "x"}], stream=True
        )
        async for _ in stream:
            pass
    [call] = traj.messages[-1].tool_calls
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("call_1", "add", {"a": 1, "b": 2})
    assert traj.turns[0].finish_reason == "tool_calls"


def test_sync_client_records_inside_a_sync_rollout(scripted) -> None:
    client = model_for(scripted).openai_client(sync=True)
    with rollout() as traj:
        client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "hi"}])
    client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "outside"}])
    assert [m.text() for m in traj.messages] == ["hi", "ok"]
    assert len(traj.turns) == 1


async def test_nothing_is_recorded_outside_a_rollout_or_by_other_clients(scripted) -> None:
    ours = model_for(scripted).openai_client()
    theirs = openai.AsyncOpenAI(base_url=scripted.base_url, api_key="x")
    await ours.chat.completions.create(model="agent", messages=[{"role": "user", "content": "before"}])
    async with rollout() as traj:
        await theirs.chat.completions.create(model="agent", messages=[{"role": "user", "content": "theirs"}])
        async with httpx.AsyncClient() as plain:
            await plain.post(
                f"{scripted.base_url}/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "raw"}]},
            )
        await ours.chat.completions.create(model="agent", messages=[{"role": "user", "content": "inside"}])
    await ours.chat.completions.create(model="agent", messages=[{"role": "user", "content": "after"}])
    assert [m.text() for m in traj.messages] == ["inside", "ok"]
    assert len(traj.turns) == 1
    assert art_agents.current_trajectory() is None
    assert ROLLOUT_HEADER not in scripted.headers[0] and ROLLOUT_HEADER not in scripted.headers[1]


async def test_fifty_concurrent_rollouts_keep_their_turns_apart(scripted) -> None:
    scripted.default = lambda body: "echo " + body["messages"][-1]["content"]
    scripted.delay_s = 0.01
    client = model_for(scripted).openai_client()

    async def one(i: int) -> Trajectory:
        async with rollout(i=i) as traj:
            history = [{"role": "user", "content": f"task {i}"}]
            for turn in range(3):
                reply = await client.chat.completions.create(model="agent", messages=history)
                history += [
                    {"role": "assistant", "content": reply.choices[0].message.content},
                    {"role": "user", "content": f"{i}.{turn}"},
                ]
                await asyncio.sleep(0)
        return traj

    trajectories = await asyncio.gather(*(one(i) for i in range(50)))
    for i, traj in enumerate(trajectories):
        assert len(traj.turns) == 3 and not traj.additional_histories
        assert traj.messages[0].content == f"task {i}"
        assert traj.messages[-1].content == f"echo {i}.1"
        assert len({t.completion_id for t in traj.turns}) == 3
    assert len({t.completion_id for traj in trajectories for t in traj.turns}) == 150


async def test_a_different_system_prompt_becomes_a_second_history(scripted) -> None:
    client = model_for(scripted).openai_client()
    async with rollout() as traj:
        await client.chat.completions.create(
            model="agent", messages=[{"role": "system", "content": "planner"}, {"role": "user", "content": "q"}]
        )
        await client.chat.completions.create(
            model="agent", messages=[{"role": "system", "content": "critic"}, {"role": "user", "content": "q"}]
        )
    assert traj.messages[0].content == "planner"
    assert traj.additional_histories[0].messages[0].content == "critic"
    assert [(t.history, t.index) for t in traj.turns] == [(0, 2), (1, 2)]


async def test_decorator_returns_the_trajectory_with_the_returned_reward(scripted) -> None:
    client = model_for(scripted).openai_client()

    @rollout
    async def attempt(question: str) -> float:
        reply = await client.chat.completions.create(model="agent", messages=[{"role": "user", "content": question}])
        return 1.0 if reply.choices[0].message.content == "ok" else 0.0

    traj = await attempt("q")
    assert isinstance(traj, Trajectory) and traj.reward == 1.0 and len(traj.turns) == 1
    assert traj.finished_at is not None


async def test_a_raising_rollout_keeps_its_partial_trajectory(scripted) -> None:
    client = model_for(scripted).openai_client()
    with pytest.raises(art_agents.RolloutFailed) as info:
        async with rollout():
            await client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "q"}])
            raise RuntimeError("tool exploded")
    traj = info.value.trajectory
    assert traj.failed and len(traj.turns) == 1
    assert "tool exploded" in traj.logs[0]

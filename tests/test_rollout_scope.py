"""Agents the toolkit never wraps: any HTTP client inside `art.rollout()`, and agents in other processes.

The server keeps each call of a rollout (in chat form, whatever protocol) and the rollout assembles them
when it ends; the trajectory then trains on the exact tokens served, like a wrapped client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
from pathlib import Path

import httpx
import pytest
from server_fixtures import hermes, scripted_model

import art_agents as art
from art_agents import RemoteBackend, TrainableModel, TrainConfig, TrajectoryGroup

AGENT = Path(__file__).parent / "agents" / "subprocess_agent.py"
ANSWER = "2 + 3 = 5."


async def run_agent(base_url: str, model: str, api_key: str) -> dict[str, str]:
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "ART_MODEL": model}
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(AGENT), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return json.loads(out)


async def test_an_agent_in_another_process_is_recorded_through_its_rollout_url_and_trains(
    backend, tiny_model_path
) -> None:
    model = await scripted_model(backend, tiny_model_path, "subprocess", [hermes("add", a=2, b=3), ANSWER])
    trajectories = []
    for reward in (1.0, 0.0):
        async with art.rollout(task="add") as trajectory:
            base_url = await model.rollout_base_url()
            assert base_url == f"{backend.base_url}/r/{trajectory.id}/v1"
            result = await run_agent(base_url, model.name, model.endpoint()[1])
            trajectory.reward = reward
        trajectories.append(trajectory)
    assert result == {"answer": ANSWER, "served_by": f"{model.name}@0"}
    assert [m.role for m in trajectory.messages] == ["user", "assistant", "tool", "assistant"]
    assert trajectory.messages[1].tool_calls[0].function.name == "add" and trajectory.messages[2].content == "5"
    assert trajectory.tools and trajectory.tools[0]["function"]["name"] == "add"
    assert [t.model for t in trajectory.turns] == [f"{model.name}@0"] * 2 and all(
        t.completion_id for t in trajectory.turns
    )

    trained = await model.train([TrajectoryGroup(trajectories)], TrainConfig(), progress=False)
    assert trained.step == 1 and trained.metrics["turns_from_store"] == 4 and trained.metrics["turns_retokenized"] == 0
    async with art.rollout():
        result = await run_agent(await model.rollout_base_url(), model.name, "k")
    assert result["served_by"] == f"{model.name}@1"


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
async def test_an_agent_in_another_language_is_recorded(backend, tiny_model_path) -> None:
    model = await scripted_model(backend, tiny_model_path, "node-agent", ["Hello from the server."])
    script = (
        "const r = await fetch(process.env.BASE + '/chat/completions', {method: 'POST', headers: "
        "{'content-type': 'application/json', authorization: 'Bearer k'}, body: JSON.stringify({model: "
        "process.env.MODEL, messages: [{role: 'user', content: 'hi'}]})}); console.log((await r.json()).model);"
    )
    async with art.rollout() as trajectory:
        env = {**os.environ, "BASE": await model.rollout_base_url(), "MODEL": model.name}
        process = await asyncio.create_subprocess_exec(
            "node", "--input-type=module", "-e", script, env=env, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await process.communicate()
    assert out.decode().strip() == f"{model.name}@0"
    assert [m.content for m in trajectory.messages] == ["hi", "Hello from the server."]
    assert trajectory.turns[0].completion_id and trajectory.turns[0].policy_step == 0


async def test_a_finished_or_unknown_rollout_url_is_refused_by_name(backend, tiny_model_path) -> None:
    model = await scripted_model(backend, tiny_model_path, "scoped-refusals", ["ok"])
    async with art.rollout() as trajectory:
        base_url = await model.rollout_base_url()
    body = {"model": model.name, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient() as http:
        finished = await http.post(f"{base_url}/chat/completions", json=body)
        unknown = await http.post(f"{backend.base_url}/r/no-such-rollout/v1/chat/completions", json=body)
        anthropic_shape = await http.post(f"{base_url}/messages", json=body)
        admin = await http.post(f"{backend.base_url}/r/{trajectory.id}/v1/art/models", json={})
        reopened = await http.post(f"{backend.base_url}/v1/art/rollouts/{trajectory.id}/open")
    assert finished.status_code == 404 and f"rollout {trajectory.id!r} has finished" in finished.json()["detail"]
    assert unknown.status_code == 404 and "'no-such-rollout' is unknown" in unknown.json()["detail"]
    assert "rollout_base_url()" in unknown.json()["detail"]
    assert anthropic_shape.json()["type"] == "error" and "has finished" in anthropic_shape.json()["error"]["message"]
    assert admin.status_code == 404 and "not a model route" in admin.json()["detail"]
    assert reopened.status_code == 409 and "has finished" in reopened.json()["detail"]
    assert len(trajectory.turns) == 0  # nothing was answered through the URL


async def test_any_httpx_client_inside_a_rollout_is_captured_and_none_outside(backend, tiny_model_path) -> None:
    model = await scripted_model(backend, tiny_model_path, "plain-httpx", ["captured"])
    body = {"model": model.name, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=f"{backend.base_url}/v1") as http:
        outside = (await http.post("/chat/completions", json=body)).json()
        async with art.rollout() as trajectory:
            inside = (await http.post("/chat/completions", json={**body, "stream": True})).text
        with art.rollout() as sync_trajectory:
            httpx.post(f"{backend.base_url}/v1/chat/completions", json=body)
    assert "data: [DONE]" in inside
    assert [m.content for m in trajectory.messages] == ["hi", "captured"] and len(trajectory.turns) == 1
    assert [m.content for m in sync_trajectory.messages] == ["hi", "captured"]
    assert trajectory.turns[0].completion_id != outside["id"]
    async with httpx.AsyncClient(base_url=backend.base_url) as http:  # the server forgot what it handed over
        record = (await http.get(f"/v1/art/rollouts/{trajectory.id}")).json()
    assert record["completions"] == 1 and record["calls"] == []


async def test_a_server_gone_by_the_rollouts_end_is_logged_not_raised(tiny_model_path, tmp_path) -> None:
    from server_fixtures import start_server

    with contextlib.ExitStack() as stack:
        backend = RemoteBackend(stack.enter_context(start_server(tmp_path / "art")))
        model = await scripted_model(backend, tiny_model_path, "gone", ["ok"])
        await backend.close()
        with pytest.warns(RuntimeWarning, match=r"could not be fetched from .*is the server still running"):
            async with art.rollout() as trajectory:
                await model.rollout_base_url()
                await asyncio.to_thread(stack.close)  # the server stops before the rollout ends
    assert any("could not be fetched" in line for line in trajectory.logs) and not trajectory.failed


async def test_an_evaluation_pins_the_step_and_the_decoding_of_any_client(backend, tiny_model_path, tmp_path) -> None:
    """`art.evaluate` sets the step it evaluates and its decoding in the model calls of SDK clients the toolkit did
    not build (the Anthropic SDK on httpx2, plain requests), as in its own clients' calls."""
    import anthropic
    import requests

    model = TrainableModel(name="eval-any", project="tests", base_model=str(tiny_model_path))
    await model.register(backend)
    group = TrajectoryGroup([await _one_call(model, backend.base_url, float(r)) for r in range(2)])
    await model.train([group], TrainConfig(), progress=False)  # the latest is now @1; the rollout names no step

    async def attempt(target: art.Model, scenario: dict[str, str]) -> art.Trajectory:
        client = anthropic.AsyncAnthropic(base_url=backend.base_url, api_key="x")
        ask = [{"role": "user", "content": scenario["q"]}]
        async with art.rollout() as trajectory:
            await client.messages.create(model=model.name, max_tokens=8, messages=ask, extra_body={"temperature": 1})
            body = {"model": model.name, "messages": ask, "max_tokens": 8, "temperature": 1.0}
            await asyncio.to_thread(requests.post, f"{backend.base_url}/v1/chat/completions", json=body, timeout=60)
        await client.close()
        return trajectory

    evaluation = await art.evaluate(
        attempt, [{"id": "s", "q": "Say something."}], [f"{model.name}@0"], steps_of=model, out=tmp_path,
        rollouts_per_scenario=2, decoding="greedy", pbar_desc=None,
    )  # fmt: skip
    first, second = evaluation.runs[f"{model.name}@0"][0].trajectories
    assert [t.model for t in first.turns + second.turns] == [f"{model.name}@0"] * 4
    assert [m.content for m in first.messages] == [m.content for m in second.messages]  # greedy: the same replies
    assert first.additional_histories[0].messages[-1].content == second.additional_histories[0].messages[-1].content


async def _one_call(model: TrainableModel, base_url: str, reward: float) -> art.Trajectory:
    async with art.rollout() as trajectory, httpx.AsyncClient() as http:
        body = {"model": model.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        await http.post(f"{base_url}/v1/chat/completions", json=body)
        trajectory.reward = reward
    return trajectory

"""Agents written for other frameworks and plain HTTP clients, captured by the server inside `art.rollout()`.

The scripted engine answers with a hermes tool call, then the final answer, through the real tokenizer,
tool-call parsing, token store and trainer: the frameworks' own OpenAI clients are not the toolkit's, so
every call is captured only by the server-side hooks (art_agents/backends/server_capture.py).
"""

from __future__ import annotations

import asyncio
import http.server
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
import requests
from scripted_openai import LoopbackServer
from server_fixtures import hermes, scripted_model

import art_agents as art
from art_agents import TrainableModel, TrainConfig, Trajectory, TrajectoryGroup
from art_agents.wire import ROLLOUT_HEADER, ROLLOUT_RECORD_HEADER

ANSWER = "The answer is 5."
QUESTION = "What is 2 + 3?"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def assert_adds(message: Any) -> None:
    """`message` asks for the add tool on 2 and 3."""
    call = message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 2, "b": 3})


def assert_tool_round(trajectory: Trajectory, model: TrainableModel) -> None:
    """The trajectory holds the add call, its result and the final answer, as two turns with completion ids."""
    messages = trajectory.messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert_adds(messages[1])
    assert (messages[2].content, messages[3].content) == ("5", ANSWER)
    assert [t.model for t in trajectory.turns] == [f"{model.name}@0"] * 2
    assert all(t.completion_id for t in trajectory.turns)


async def train_one_step(model: TrainableModel, trajectories: list[Trajectory]) -> None:
    for trajectory, reward in zip(trajectories, (1.0, 0.0), strict=True):
        trajectory.reward = reward
    result = await model.train([TrajectoryGroup(trajectories)], TrainConfig(), progress=False)
    assert result.step == 1 and result.metrics["turns_retokenized"] == 0 and result.metrics["turns_from_store"] == 4


# --- pydantic-ai -------------------------------------------------------------------------


def pydantic_agent(server: str, name: str, api: str) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=f"{server}/v1", api_key="x")
    kind = OpenAIChatModel if api == "chat" else OpenAIResponsesModel
    agent = Agent(kind(name, provider=provider))
    agent.tool_plain(add)
    return agent


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_pydantic_ai_agent_is_captured_and_trains(server, backend, tiny_model_path, api) -> None:
    model = await scripted_model(backend, tiny_model_path, f"pydantic-ai-{api}", [hermes("add", a=2, b=3), ANSWER])
    agent = pydantic_agent(server, model.name, api)
    trajectories = []
    for _ in range(2):
        async with art.rollout() as trajectory:
            result = await agent.run(QUESTION)
        assert result.output == ANSWER
        assert_tool_round(trajectory, model)
        trajectories.append(trajectory)
    await train_one_step(model, trajectories)
    result = await agent.run(QUESTION)
    assert {m.model_name for m in result.all_messages() if hasattr(m, "model_name")} == {f"{model.name}@1"}


# --- smolagents --------------------------------------------------------------------------


def smolagents_run(server: str, name: str) -> tuple[Trajectory, Any]:
    """One `ToolCallingAgent` run inside a plain `with art.rollout()` (smolagents is synchronous)."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    # smolagents asks for tool_choice="required" by default, which the server refuses (it cannot force a tool call)
    llm = OpenAIServerModel(model_id=name, api_base=f"{server}/v1", api_key="x", tool_choice="auto")
    agent = ToolCallingAgent(tools=[tool(add)], model=llm, max_steps=3, verbosity_level=0)
    with art.rollout() as trajectory:
        answer = agent.run(QUESTION)
    return trajectory, answer


async def test_smolagents_tool_calling_agent_is_captured(server, backend, tiny_model_path) -> None:
    texts = [hermes("add", a=2, b=3), hermes("final_answer", answer=5)]
    model = await scripted_model(backend, tiny_model_path, "smolagents", texts)
    trajectory, answer = await asyncio.to_thread(smolagents_run, server, model.name)
    assert answer == 5
    assert_adds(trajectory.messages[-1])
    assert {t["function"]["name"] for t in trajectory.tools} == {"add", "final_answer"}
    # smolagents sends its tool round back as text ("Calling tools: ..." and a user "Observation:"), so the second
    # call does not extend the first and is a history of its own, captured as sent
    second = trajectory.additional_histories[0].messages
    assert [part["text"] for part in second[-2].content] == ["Observation:\n5"]
    assert second[-1].tool_calls[0].function.name == "final_answer"
    assert [(t.history, t.model) for t in trajectory.turns] == [(0, f"{model.name}@0"), (1, f"{model.name}@0")]
    assert all(t.completion_id for t in trajectory.turns)


# --- plain HTTP clients ------------------------------------------------------------------


class HeaderLog(http.server.BaseHTTPRequestHandler):
    """A loopback HTTP server that is not an art-agents server: it answers `{}` and keeps the headers it got."""

    seen: list[dict[str, str]]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """The base URL of another loopback server and the headers of every request it got."""
    seen: list[dict[str, str]] = []
    handler = type("Handler", (HeaderLog,), {"seen": seen})
    server = LoopbackServer(handler).start()
    try:
        yield server.url, seen
    finally:
        server.close()


def chat_request(model: TrainableModel) -> dict[str, Any]:
    return {"model": model.name, "messages": [{"role": "user", "content": QUESTION}]}


async def assert_plain_capture(
    server: str, model: TrainableModel, trajectory: Trajectory, inside: tuple[dict[str, Any], Any], outside: Any
) -> None:
    """The call inside the rollout carried its id and is its one turn; the same call outside carried none."""
    reply, sent = inside
    assert (sent[ROLLOUT_HEADER], sent[ROLLOUT_RECORD_HEADER]) == (trajectory.id, "1")
    assert ROLLOUT_HEADER not in outside and ROLLOUT_RECORD_HEADER not in outside
    assert [(m.role, m.content) for m in trajectory.messages] == [("user", QUESTION), ("assistant", ANSWER)]
    assert [(t.completion_id, t.model) for t in trajectory.turns] == [(reply["id"], f"{model.name}@0")]
    async with httpx.AsyncClient() as http:
        record = (await http.get(f"{server}/v1/art/rollouts/{trajectory.id}")).json()
    assert (record["completions"], record["calls"]) == (1, [])  # handed over at the end; the outside call not in it


def requests_calls(server: str, other: str, body: dict[str, Any]) -> tuple[Trajectory, Any, Any]:
    url = f"{server}/v1/chat/completions"
    with art.rollout() as trajectory:
        inside = requests.post(url, json=body, timeout=60)
        requests.post(f"{other}/v1/chat/completions", json=body, timeout=60)
    outside = requests.post(url, json=body, timeout=60)
    return trajectory, (inside.json(), inside.request.headers), outside.request.headers


async def test_requests_inside_a_rollout_is_captured(server, backend, tiny_model_path, other_server) -> None:
    model = await scripted_model(backend, tiny_model_path, "plain-requests", [ANSWER])
    other, seen = other_server
    trajectory, inside, outside = await asyncio.to_thread(requests_calls, server, other, chat_request(model))
    await assert_plain_capture(server, model, trajectory, inside, outside)
    assert len(seen) == 1 and not {ROLLOUT_HEADER, ROLLOUT_RECORD_HEADER} & set(seen[0])


async def test_aiohttp_inside_a_rollout_is_captured(server, backend, tiny_model_path, other_server) -> None:
    model = await scripted_model(backend, tiny_model_path, "plain-aiohttp", [ANSWER])
    other, seen = other_server
    body, url = chat_request(model), f"{server}/v1/chat/completions"
    async with aiohttp.ClientSession() as session:
        async with art.rollout() as trajectory:
            async with session.post(url, json=body) as response:
                inside = (await response.json(), response.request_info.headers)
            async with session.post(f"{other}/v1/chat/completions", json=body) as response:
                assert response.status == 200
        async with session.post(url, json=body) as response:
            outside = response.request_info.headers
    await assert_plain_capture(server, model, trajectory, inside, outside)
    assert len(seen) == 1 and not {ROLLOUT_HEADER, ROLLOUT_RECORD_HEADER} & set(seen[0])

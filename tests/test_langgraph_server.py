"""LangGraph door against the real art-agents server (scripted engine: real tokenizer, store, training)."""

from __future__ import annotations

import asyncio
import warnings

import httpx
import pytest
from langgraph_agents import (
    answer_then_sidecar,
    assert_matches_state,
    node_of,
    prompted,
    react_agent,
    writer_then_review,
)
from server_fixtures import hermes, scripted_model

from art_agents import TrainConfig, TrajectoryGroup
from art_agents.integrations.langgraph import MissingCallsWarning, wrap
from art_agents.wire import ROLLOUT_HEADER

ANSWER = "The answer is 5."


@pytest.mark.parametrize("constructor", ["create_agent", "create_react_agent"])
async def test_react_agent_on_the_real_server_captures_and_trains(backend, tiny_model_path, constructor) -> None:
    model = await scripted_model(backend, tiny_model_path, f"react-{constructor}", [hermes("add", a=2, b=3), ANSWER])
    agent = wrap(react_agent(model.chat_model(temperature=1.0), constructor), model=model)
    trajectories = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingCallsWarning)  # the server's count matches the capture
        for reward in (1.0, 0.0):
            trajectory, state = await agent.ainvoke({"messages": [("user", "What is 2 + 3?")]})
            trajectory.reward = reward
            trajectories.append(trajectory)
    assert_matches_state(trajectory, state["messages"])
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
    call = trajectory.messages[2].tool_calls[0]
    assert (call.function.name, trajectory.messages[3].content, trajectory.messages[4].content) == ("add", "5", ANSWER)
    assert [(t.span, t.policy_step, t.model) for t in trajectory.turns] == [
        (node_of(constructor), 0, f"{model.name}@0")
    ] * 2
    assert all(t.completion_id for t in trajectory.turns)

    result = await model.train([TrajectoryGroup(trajectories)], TrainConfig(), progress=False)
    assert result.step == 1 and await model.get_step() == 1
    assert result.metrics["turns_from_store"] == 4 and result.metrics["turns_retokenized"] == 0
    assert result.metrics["skipped"] == 0


async def test_sixteen_concurrent_graph_rollouts_on_the_real_server(backend, tiny_model_path) -> None:
    model = await scripted_model(backend, tiny_model_path, "concurrent", [ANSWER])
    agent = wrap(react_agent(model.chat_model(), "create_agent"), model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingCallsWarning)
        results = await asyncio.gather(*(agent.ainvoke({"messages": [("user", f"question {n}")]}) for n in range(16)))
    for n, (trajectory, state) in enumerate(results):
        assert_matches_state(trajectory, state["messages"])
        assert trajectory.messages[1].content == f"question {n}" and len(trajectory.turns) == 1
    assert len({t.completion_id for trajectory, _ in results for t in trajectory.turns}) == 16
    async with httpx.AsyncClient(base_url=backend.base_url) as http:
        counts = [(await http.get(f"/v1/art/rollouts/{t.id}")).json()["completions"] for t, _ in results]
    assert counts == [1] * 16


async def test_a_call_that_bypasses_capture_is_reported(backend, tiny_model_path) -> None:
    model = await scripted_model(backend, tiny_model_path, "sidecar", [ANSWER])
    graph = answer_then_sidecar(model.chat_model(), model.inference_base_url, model.name)
    with pytest.warns(MissingCallsWarning, match=r"answered 2 completions but 1 were captured.*sidecar \(0 captured\)"):
        trajectory, _ = await wrap(graph, model=model).ainvoke({"messages": [("user", "q")]})
    assert ROLLOUT_HEADER == "x-art-rollout-id" and trajectory.metrics["missing_calls"] == 1


async def test_two_prompts_and_a_subgraph_give_two_histories_that_train(backend, tiny_model_path) -> None:
    model = await scripted_model(backend, tiny_model_path, "two-nodes", ["A short poem.", "Looks good."])
    llm = model.chat_model()
    graph = writer_then_review(prompted(llm, "You write."), "critic", prompted(llm, "You review."))
    agent = wrap(graph, model=model)
    trajectories = [(await agent.ainvoke({"messages": [("user", "a poem")]})).trajectory for _ in range(2)]
    trajectory = trajectories[0]
    assert [(t.span, t.history) for t in trajectory.turns] == [("writer", 0), ("review/critic", 1)]
    assert trajectory.additional_histories[0].messages[0].content == "You review."
    trajectories[0].reward = 1.0
    result = await model.train([TrajectoryGroup(trajectories)], TrainConfig(), progress=False)
    assert result.step == 1 and result.metrics["turns_from_store"] == 4

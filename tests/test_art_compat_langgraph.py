"""ART's LangGraph idioms (`art.langgraph.init_chat_model`, `wrap_rollout`) with only the import renamed."""

from __future__ import annotations

import warnings

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.prebuilt import create_react_agent
from langgraph_agents import TOOLS, tool_call
from pydantic import BaseModel
from server_fixtures import hermes

import art_agents as art
from art_agents.integrations.langgraph import MissingCallsWarning
from art_agents.langgraph import init_chat_model, wrap_rollout

SYSTEM = "You are a calculator. Use the tools, then state the answer."


class Scenario(BaseModel):
    question: str
    answer: int


class CalculatorTrajectory(art.Trajectory):
    """ART programs subclass the trajectory for their own fields; wrap_rollout must keep them."""

    final_answer: str | None = None


async def rollout(model: art.Model, scenario: Scenario) -> CalculatorTrajectory:
    """An ART rollout as ART's docs write one; only `import art` became `import art_agents as art`."""
    traj = CalculatorTrajectory(reward=0.0, messages_and_choices=[], metadata={"question": scenario.question})
    chat_model = init_chat_model(model.name, temperature=1.0)
    agent = create_react_agent(chat_model, TOOLS)
    state = await agent.ainvoke(
        {"messages": [SystemMessage(content=SYSTEM), HumanMessage(content=scenario.question)]},
        config={"recursion_limit": 12},
    )
    traj.final_answer = state["messages"][-1].content
    used_tool = any(m.type == "tool" for m in state["messages"])
    correct = str(scenario.answer) in (traj.final_answer or "")
    traj.reward = (0.5 if correct else 0.0) + (0.5 if correct and used_tool else 0.0)
    traj.metrics["used_tool"] = used_tool
    return traj


async def test_init_chat_model_outside_wrap_rollout_names_it() -> None:
    with pytest.raises(art.ArtError, match=r"outside a wrapped rollout.*wrap_rollout\(model, rollout_fn\)"):
        init_chat_model("agent", temperature=1.0)


async def test_wrap_rollout_returns_the_functions_trajectory_with_the_captured_calls(scripted) -> None:
    """Against a scripted endpoint: the returned object is the rollout's own (subclass) trajectory."""
    scripted.replies = [{"content": None, "tool_calls": [tool_call("c1", "add", a=2, b=3)]}, "It is 5."]
    model = art.Model(name="agent", inference_base_url=scripted.base_url)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingCallsWarning)
        traj = await wrap_rollout(model, rollout)(model, Scenario(question="What is 2 + 3?", answer=5))
    assert isinstance(traj, CalculatorTrajectory) and traj.final_answer == "It is 5."
    assert (traj.reward, traj.metrics["used_tool"], traj.metadata) == (1.0, True, {"question": "What is 2 + 3?"})
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.tools and {t["function"]["name"] for t in traj.tools} == {"add", "multiply"}
    assert [(t.index, t.completion_id, t.span, t.policy_step) for t in traj.turns] == [
        (2, "chatcmpl-0", "agent", 0),
        (4, "chatcmpl-1", "agent", 0),
    ]
    assert scripted.requests[0]["model"] == "agent" and scripted.requests[0]["temperature"] == 1.0
    assert scripted.rollout_counts[traj.id] == 2  # the returned trajectory carries the id the server counted


async def test_other_conversations_follow_the_rollouts_own_histories_and_failures_are_counted(scripted) -> None:
    scripted.replies = ["draft", "fine"]
    model = art.Model(name="agent", inference_base_url=scripted.base_url)

    async def two_prompts(model: art.Model, fail: bool) -> art.Trajectory:
        traj = art.Trajectory(additional_histories=[art.History(messages=[{"role": "user", "content": "notes"}])])
        llm = init_chat_model()
        draft = await llm.ainvoke([("system", "You write."), ("user", "a poem")])
        await llm.ainvoke([("system", "You review."), ("user", draft.content)])
        if fail:
            raise ValueError("judge unavailable")
        return traj

    traj = await wrap_rollout(model, two_prompts)(model, False)
    assert [h.messages[0].text() for h in traj.additional_histories] == ["notes", "You review."]
    assert [(t.history, t.index) for t in traj.turns] == [(0, 2), (2, 2)]
    assert traj.messages[0].text() == "You write." and traj.history_messages(2)[2].text() == "fine"

    group = await art.TrajectoryGroup([wrap_rollout(model, two_prompts)(model, True)])
    [failure] = group.exceptions
    assert failure.type == "ValueError" and failure.trajectory is not None and len(failure.trajectory.turns) == 2


class Verdict(BaseModel):
    correct: bool


async def test_structured_output_asks_through_a_tool_as_art_does(scripted) -> None:
    """Our server refuses `response_format` and forced `tool_choice`; ART's chat model asks with a plain tool."""
    scripted.replies = [{"content": None, "tool_calls": [tool_call("v1", "Verdict", correct=1)]}]
    model = art.Model(name="judge", inference_base_url=scripted.base_url)

    async def judge(model: art.Model) -> float:
        verdict = await init_chat_model(temperature=0.0).with_structured_output(Verdict).ainvoke("Is 2 + 3 = 5?")
        return float(verdict.correct)

    traj = await wrap_rollout(model, judge)(model)
    assert traj.reward == 1.0 and len(traj.turns) == 1
    [request] = scripted.requests
    assert "response_format" not in request and request.get("tool_choice") in (None, "auto")
    assert [t["function"]["name"] for t in request["tools"]] == ["Verdict"]


async def test_an_art_langgraph_program_trains_on_the_tokens_it_sampled(backend, tiny_model_path) -> None:
    """ART's training loop: wrapped rollouts gathered into groups, then `model.train`.

    The scripted engine answers in turn a tool call, the right answer and a wrong one, shared by the
    concurrent rollouts, so some call the tool and some answer right or wrong: the rewards differ.
    """
    config = art.ModelConfig(
        engine="scripted",
        scripted_responses=[hermes("add", a=2, b=3), "The answer is 5.", "I do not know."],
        default_max_tokens=64,
    )
    model = art.TrainableModel(name="art-langgraph", project="tests", base_model=str(tiny_model_path), config=config)
    await model.register(backend)
    scenario = Scenario(question="What is 2 + 3?", answer=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingCallsWarning)  # the server's count matches the capture
        groups = await art.gather_trajectory_groups(
            [art.TrajectoryGroup(wrap_rollout(model, rollout)(model, scenario) for _ in range(4))]
        )
    [group] = groups
    assert len(group.trajectories) == 4 and not group.exceptions
    assert len(set(group.rewards())) > 1, group.rewards()
    for traj in group.trajectories:
        assert isinstance(traj, CalculatorTrajectory) and traj.turns
        assert traj.messages[-1].role == "assistant" and traj.messages[-1].text() == traj.final_answer
        assert all(t.completion_id and t.model == f"{model.name}@0" for t in traj.turns)
    calls = sum(len(traj.turns) for traj in group.trajectories)

    result = await model.train(groups, art.TrainConfig(), progress=False)
    assert result.step == 1 and await model.get_step() == 1
    assert result.metrics["turns_retokenized"] == 0 and result.metrics["turns_from_store"] == calls

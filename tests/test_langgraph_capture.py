"""LangGraph door against a scripted OpenAI-compatible server: real graphs, real tools, real ChatOpenAI."""

from __future__ import annotations

import asyncio
import warnings

import pytest
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph_agents import (
    SYSTEM,
    add,
    answer_then_sidecar,
    assert_matches_state,
    node_of,
    prompted,
    react_agent,
    tool_call,
    writer_then_review,
)
from pydantic import BaseModel

import art_agents
from art_agents import Model, RolloutFailed, TrajectoryGroup, gather_trajectory_groups
from art_agents.integrations.langgraph import (
    MissingCallsWarning,
    chat_model,
    graph_rollout,
    http_clients,
    wrap,
)
from art_agents.wire import ROLLOUT_HEADER

CONSTRUCTORS = ["create_agent", "create_react_agent"]


def model_for(server) -> Model:
    return Model(name="agent", inference_base_url=server.base_url)


def two_tool_script() -> list:
    return [
        {"content": None, "tool_calls": [tool_call("c1", "add", a=2, b=3), tool_call("c2", "multiply", a=4, b=5)]},
        "5 and 20",
    ]


@pytest.mark.parametrize("constructor", CONSTRUCTORS)
async def test_react_agent_trajectory_equals_final_state(scripted, constructor) -> None:
    scripted.replies = two_tool_script()
    model = model_for(scripted)
    agent = wrap(react_agent(model.chat_model(), constructor), model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingCallsWarning)
        trajectory, state = await agent.ainvoke({"messages": [("user", "add 2+3 and 4*5")]})
    assert_matches_state(trajectory, state["messages"])
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert [m.content for m in trajectory.messages[3:5]] == ["5", "20"]
    assert [(t.index, t.completion_id, t.span, t.policy_step) for t in trajectory.turns] == [
        (2, "chatcmpl-0", node_of(constructor), 0),
        (5, "chatcmpl-1", node_of(constructor), 0),
    ]
    assert {t["function"]["name"] for t in trajectory.tools} == {"add", "multiply"}
    assert [h[ROLLOUT_HEADER] for h in scripted.headers] == [trajectory.id] * 2
    assert trajectory.finished_at is not None and not trajectory.failed


@pytest.mark.parametrize("constructor", CONSTRUCTORS)
def test_sync_invoke_and_streamed_answers(scripted, constructor) -> None:
    scripted.replies = two_tool_script()
    llm = chat_model(model_for(scripted), streaming=True)
    trajectory, state = wrap(react_agent(llm, constructor)).invoke({"messages": [("user", "go")]})
    assert_matches_state(trajectory, state["messages"])
    # streamed: the transport records the completion ids, the callbacks lend the node names
    assert [(t.completion_id, t.span) for t in trajectory.turns] == [
        ("chatcmpl-0", node_of(constructor)),
        ("chatcmpl-1", node_of(constructor)),
    ]


async def test_user_built_chat_openai_is_captured_by_callbacks(scripted) -> None:
    scripted.replies = two_tool_script()
    llm = ChatOpenAI(model="agent", base_url=scripted.base_url, api_key="x")
    trajectory, state = await wrap(react_agent(llm, "create_agent")).ainvoke({"messages": [("user", "go")]})
    assert_matches_state(trajectory, state["messages"])
    assert [(t.completion_id, t.span, t.model) for t in trajectory.turns] == [
        ("chatcmpl-0", "model", "agent@0"),
        ("chatcmpl-1", "model", "agent@0"),
    ]
    assert ROLLOUT_HEADER not in scripted.headers[0]  # no header: the missing-call check stays quiet


async def test_user_built_client_with_capture_clients_sends_the_header(scripted) -> None:
    llm = ChatOpenAI(model="agent", base_url=scripted.base_url, api_key="x", streaming=True, **http_clients())
    trajectory, _ = await wrap(react_agent(llm, "create_agent")).ainvoke({"messages": [("user", "hi")]})
    assert scripted.headers[0][ROLLOUT_HEADER] == trajectory.id
    assert trajectory.turns[0].completion_id == "chatcmpl-0"


async def test_astream_and_stream_capture_and_leave_the_consumer_alone(scripted) -> None:
    scripted.replies = [*two_tool_script(), *two_tool_script()]
    model = model_for(scripted)
    agent = wrap(react_agent(model.chat_model(), "create_agent"), model=model)
    run = agent.astream({"messages": [("user", "go")]}, stream_mode="values")
    chunks = []
    async for chunk in run:
        assert art_agents.current_trajectory() is None  # the consumer's code is not inside the rollout
        chunks.append(chunk)
    assert_matches_state(run.trajectory, chunks[-1]["messages"])
    assert len(run.trajectory.turns) == 2

    sync_run = agent.stream({"messages": [("user", "go")]}, stream_mode="values")
    sync_chunks = list(sync_run)
    assert_matches_state(sync_run.trajectory, sync_chunks[-1]["messages"])
    assert sync_run.trajectory.id != run.trajectory.id


async def test_final_tool_result_of_a_run_lands(scripted) -> None:
    from langchain_core.tools import tool

    @tool(return_direct=True)
    def lookup(key: str) -> str:
        """Look a key up; its answer ends the run."""
        return f"value of {key}"

    scripted.replies = [
        {
            "content": None,
            "tool_calls": [{**tool_call("c9", "lookup"), "function": {"name": "lookup", "arguments": '{"key": "k"}'}}],
        }
    ]
    from langchain.agents import create_agent

    graph = create_agent(model_for(scripted).chat_model(), [lookup], system_prompt=SYSTEM)
    trajectory, state = await wrap(graph).ainvoke({"messages": [("user", "look k up")]})
    assert state["messages"][-1].type == "tool"
    assert_matches_state(trajectory, state["messages"])
    assert trajectory.messages[-1].content == "value of k"


class Verdict(BaseModel):
    correct: bool


async def test_two_llm_nodes_subgraph_and_structured_output(scripted) -> None:
    """A writer node and a sub-graph reviewer with other prompts: separate histories, node paths as spans."""
    scripted.replies = ["draft", '{"correct": true}', "polished"]
    llm = model_for(scripted).chat_model()

    async def judge(state: MessagesState) -> dict:
        verdict = await llm.with_structured_output(Verdict).ainvoke([("system", "You judge."), state["messages"][-1]])
        return {"messages": [("user", f"verdict: {verdict.correct}; polish it")]}

    graph = writer_then_review(prompted(llm, "You write."), "judge", judge, editor=prompted(llm, "You write."))
    trajectory, state = await wrap(graph).ainvoke({"messages": [("user", "write a poem")]})
    assert [t.span for t in trajectory.turns] == ["writer", "review/judge", "editor"]
    assert [t.history for t in trajectory.turns] == [0, 1, 0]
    assert_matches_state(trajectory, state["messages"], system="You write.")
    [judge_history] = trajectory.additional_histories
    assert [(m.role, m.text()) for m in judge_history.messages] == [
        ("system", "You judge."),
        ("assistant", "draft"),
        ("assistant", '{"correct": true}'),
    ]


async def test_bind_tools_in_a_custom_node(scripted) -> None:
    scripted.replies = [{"content": None, "tool_calls": [tool_call("c1", "add", a=1, b=1)]}]
    llm = model_for(scripted).chat_model().bind_tools([add])

    def think(state: MessagesState) -> dict:
        return {"messages": [llm.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("think", think)
    graph.add_edge(START, "think")
    trajectory, _ = wrap(graph.compile()).invoke({"messages": [("user", "1+1")]})
    assert trajectory.tools[0]["function"]["name"] == "add"
    assert trajectory.turns[0].span == "think"
    assert trajectory.messages[-1].tool_calls[0].function.name == "add"


async def test_sixteen_concurrent_rollouts_stay_apart(scripted) -> None:
    def echo(body: dict) -> dict | str:
        question = body["messages"][1]["content"]
        if body["messages"][-1]["role"] == "user":
            n = int(question.split()[-1])
            return {"content": None, "tool_calls": [tool_call(f"c{n}", "add", a=n, b=n)]}
        return f"answer {body['messages'][-1]['content']} to {question}"

    scripted.default = echo
    scripted.delay_s = 0.02
    model = model_for(scripted)
    agent = wrap(react_agent(model.chat_model(), "create_agent"), model=model)
    results = await asyncio.gather(*(agent.ainvoke({"messages": [("user", f"double {n}")]}) for n in range(16)))
    for n, (trajectory, state) in enumerate(results):
        assert_matches_state(trajectory, state["messages"])
        assert trajectory.messages[-1].content == f"answer {2 * n} to double {n}"
        assert len(trajectory.turns) == 2
    assert len({t.completion_id for trajectory, _ in results for t in trajectory.turns}) == 32


async def test_outside_wrap_the_graph_runs_and_nothing_is_recorded(scripted) -> None:
    scripted.replies = two_tool_script()
    graph = react_agent(model_for(scripted).chat_model(), "create_agent")
    state = await graph.ainvoke({"messages": [("user", "go")]})
    assert state["messages"][-1].content == "5 and 20"
    assert art_agents.current_trajectory() is None
    assert all(ROLLOUT_HEADER not in h for h in scripted.headers)
    async with art_agents.rollout() as plain:  # a plain rollout does not install the callbacks
        pass
    assert plain.turns == []


async def test_a_raising_graph_gives_a_failed_trajectory_counted_in_max_exceptions(scripted) -> None:
    scripted.default = lambda body: {"content": None, "tool_calls": [tool_call("c1", "add", a=1, b=2)]}
    model = model_for(scripted)

    def explode(state: MessagesState) -> dict:
        raise RuntimeError("tool backend down")

    graph = StateGraph(MessagesState)
    llm = model.chat_model()
    graph.add_node("think", lambda state: {"messages": [llm.invoke(state["messages"])]})
    graph.add_node("act", explode)
    graph.add_edge(START, "think")
    graph.add_edge("think", "act")
    agent = wrap(graph.compile(), model=model)

    with pytest.raises(RolloutFailed) as info:
        await agent.ainvoke({"messages": [("user", "go")]})
    failed = info.value.trajectory
    assert failed.failed and any("tool backend down" in line for line in failed.logs)
    assert failed.turns[0].span == "think"

    # streamed runs fail the same way, for the async and the sync stream
    with pytest.raises(RolloutFailed, match="tool backend down"):
        async for _ in agent.astream({"messages": [("user", "go")]}):
            pass
    sync_run = agent.stream({"messages": [("user", "go")]})
    with pytest.raises(RolloutFailed, match="tool backend down"):
        list(sync_run)
    assert sync_run.trajectory.failed and sync_run.trajectory.turns[0].span == "think"

    groups = await gather_trajectory_groups(
        [TrajectoryGroup(agent.rollout({"messages": [("user", "go")]}, reward=lambda out, t: 1.0) for _ in range(3))],
        max_exceptions=3,
        pbar_desc=False,
    )
    [group] = groups
    assert group.trajectories == [] and len(group.exceptions) == 3
    assert all(e.trajectory.failed and e.message == "tool backend down" for e in group.exceptions)


async def test_missing_call_check_warns_with_node_names(scripted) -> None:
    model = model_for(scripted)
    graph = answer_then_sidecar(model.chat_model(), scripted.base_url, "agent")
    with pytest.warns(
        MissingCallsWarning,
        match=r"answered 2 completions but 1 were captured.*answer \(1 captured\), sidecar \(0 captured\)",
    ):
        trajectory, _ = await wrap(graph, model=model).ainvoke({"messages": [("user", "plan")]})
    assert trajectory.metrics["missing_calls"] == 1
    assert "sidecar" in trajectory.logs[-1]


async def test_graph_rollout_decorator_and_context_manager(scripted) -> None:
    scripted.replies = [*two_tool_script(), *two_tool_script()]
    model = model_for(scripted)
    graph = react_agent(model.chat_model(), "create_react_agent")

    @graph_rollout
    async def solve(question: str) -> float:
        state = await graph.ainvoke({"messages": [("user", question)]})
        return float(state["messages"][-1].content == "5 and 20")

    trajectory = await solve("go")
    assert trajectory.reward == 1.0 and [t.span for t in trajectory.turns] == ["agent", "agent"]

    async with graph_rollout(model=model, task="t1") as traj:
        state = await graph.ainvoke({"messages": [("user", "go")]})
    assert_matches_state(traj, state["messages"])
    assert traj.metadata == {"task": "t1"}


async def test_decorator_with_arguments_and_a_raising_reward(scripted) -> None:
    model = model_for(scripted)
    graph = react_agent(model.chat_model(), "create_agent")

    @graph_rollout(model=model, task="greet")
    async def greet() -> float:
        await graph.ainvoke({"messages": [("user", "hi")]})
        return 0.5

    first, second = await greet(), await greet()
    assert first.id != second.id and first.reward == 0.5 and first.metadata == {"task": "greet"}
    assert [len(t.turns) for t in (first, second)] == [1, 1]

    def broken_reward(output, trajectory) -> float:
        raise ValueError("no answer key")

    [group] = await gather_trajectory_groups(
        [TrajectoryGroup([wrap(graph).rollout({"messages": [("user", "hi")]}, reward=broken_reward)])],
        max_exceptions=1,
        pbar_desc=False,
    )
    [failure] = group.exceptions
    assert failure.trajectory.failed and "no answer key" in failure.trajectory.logs[-1]
    assert len(failure.trajectory.turns) == 1

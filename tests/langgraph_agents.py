"""Real LangGraph agents and tools shared by the LangGraph tests (scripted server and real server)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.tools import tool

from art_agents import Trajectory
from art_agents.integrations.langchain_callbacks import to_openai
from art_agents.messages import as_messages

SYSTEM = "You are a calculator. Use the tools."


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


TOOLS = [add, multiply]


def react_agent(llm: Any, constructor: str, **kwargs: Any) -> Any:
    """The same ReAct agent from LangChain's `create_agent` or LangGraph's older `create_react_agent`."""
    if constructor == "create_agent":
        from langchain.agents import create_agent

        return create_agent(llm, TOOLS, system_prompt=SYSTEM, **kwargs)
    from langgraph.prebuilt import create_react_agent

    return create_react_agent(llm, TOOLS, prompt=SYSTEM, **kwargs)


def prompted(llm: Any, system: str) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
    """A graph node that asks `llm` under its own system prompt, so it gets its own history."""

    async def node(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke([("system", system), *state["messages"]])]}

    return node


def writer_then_review(writer: Any, reviewer_name: str, reviewer: Any, editor: Any = None) -> Any:
    """Compiled `writer -> review [-> editor]`, where `review` is a sub-graph holding one node, `reviewer_name`."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    review = StateGraph(MessagesState)
    review.add_node(reviewer_name, reviewer)
    review.add_edge(START, reviewer_name)
    graph = StateGraph(MessagesState)
    graph.add_node("writer", writer)
    graph.add_node("review", review.compile())
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "review")
    last = "review"
    if editor is not None:
        graph.add_node("editor", editor)
        graph.add_edge("review", "editor")
        last = "editor"
    graph.add_edge(last, END)
    return graph.compile()


def answer_then_sidecar(llm: Any, base_url: str, model_name: str) -> Any:
    """Compiled `answer -> sidecar`; `sidecar` calls the server with a raw client that sends the rollout id
    (so the server counts the call) but is not captured."""
    import openai
    from langgraph.graph import END, START, MessagesState, StateGraph

    from art_agents.integrations.langgraph import rollout_headers

    async def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    async def sidecar(state: MessagesState) -> dict[str, Any]:
        raw = openai.AsyncOpenAI(base_url=base_url, api_key="x", default_headers=rollout_headers())
        await raw.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "psst"}])
        await raw.close()
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_node("sidecar", sidecar)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", "sidecar")
    graph.add_edge("sidecar", END)
    return graph.compile()


def node_of(constructor: str) -> str:
    return "model" if constructor == "create_agent" else "agent"


def tool_call(call_id: str, name: str, **arguments: int) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def assert_matches_state(trajectory: Trajectory, messages: list[BaseMessage], *, system: str | None = SYSTEM) -> None:
    """The captured main history is, message for message, the graph's final state (plus its prompt)."""
    expected = as_messages(([{"role": "system", "content": system}] if system else []) + to_openai(messages))
    got = trajectory.messages
    assert len(got) == len(expected), ([m.role for m in got], [m.role for m in expected])
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.same_as(b), (index, a, b)

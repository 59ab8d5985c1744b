"""Anthropic Messages (`POST /v1/messages`) on the real server, through the real anthropic SDK, LangChain's
ChatAnthropic and LiteLLM's anthropic provider: served as the scripted engine's real tokens (or the tiny random
model's, or SmolLM2's when slow), captured inside `art.rollout()` by the server, and trained on."""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx
import pytest
from langgraph_agents import react_agent
from server_fixtures import hermes, scripted_model, start_server

import art_agents as art
from art_agents import ModelConfig, RemoteBackend, TrainableModel, TrainConfig, Trajectory, TrajectoryGroup
from art_agents.server.formats.anthropic_messages import (
    MessagesRequest,
    chat_body,
    content_blocks,
    message_events,
)
from art_agents.server.serving.completions import StreamDelta

ANSWER = "The answer is 5."
ADD = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    "cache_control": {"type": "ephemeral"},
}
ASK = "What is 2 + 3?"
QUESTION = {"role": "user", "content": [{"type": "text", "text": ASK, "cache_control": {"type": "ephemeral"}}]}
SYSTEM = [{"type": "text", "text": "You add numbers."}]
HI = [{"role": "user", "content": "hi"}]


def client_of(server: str, api_key: str = "x", **options: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=server, api_key=api_key, max_retries=0, **options)


def sdk_arguments(request: dict[str, Any]) -> dict[str, Any]:
    """`request` as `messages.create` arguments: the fields this SDK has no parameter for (it dropped temperature,
    top_p and top_k) go in `extra_body`, as its users send them."""
    known = inspect.signature(anthropic.AsyncAnthropic(api_key="x").messages.create).parameters
    extra = {key: value for key, value in request.items() if key not in known}
    return {key: value for key, value in request.items() if key in known} | ({"extra_body": extra} if extra else {})


async def create(client: anthropic.AsyncAnthropic, mode: str, **request: Any) -> anthropic.types.Message:
    """One Messages call made the way `mode` names: plain, `stream=True` events, or the `stream()` helper."""
    arguments = sdk_arguments(request)
    if mode == "create":
        return await client.messages.create(**arguments)
    if mode == "stream_helper":
        async with client.messages.stream(**arguments) as stream:
            return await stream.get_final_message()
    events = [event async for event in await client.messages.create(**arguments, stream=True)]
    names = [event.type for event in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    return assembled(events)


def assembled(events: list[Any]) -> anthropic.types.Message:
    """The message a stream of raw events describes, put together by hand (not by the SDK's helper)."""
    message = events[0].message.model_copy(deep=True)
    partial: dict[int, str] = {}
    for event in events[1:]:
        if event.type == "content_block_start":
            message.content.append(event.content_block.model_copy(deep=True))
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            message.content[event.index].text += event.delta.text
        elif event.type == "content_block_delta" and event.delta.type == "thinking_delta":
            message.content[event.index].thinking += event.delta.thinking
        elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            partial[event.index] = partial.get(event.index, "") + event.delta.partial_json
        elif event.type == "message_delta":
            message.stop_reason, message.stop_sequence = event.delta.stop_reason, event.delta.stop_sequence
            message.usage.output_tokens = event.usage.output_tokens
    for index, text in partial.items():
        message.content[index].input = json.loads(text)
    return message


async def tool_round_trip(client: anthropic.AsyncAnthropic, model: str, mode: str) -> tuple[Any, Any]:
    """Ask, run the `add` tool the model called, send its result back: (the tool-use reply, the final reply)."""
    request: dict[str, Any] = {"model": model, "max_tokens": 64, "system": SYSTEM, "tools": [ADD]}
    first = await create(client, mode, messages=[QUESTION], **request)
    use = first.content[-1]
    result = {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "5"}]}
    follow_up = [QUESTION, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]
    return first, await create(client, mode, messages=follow_up, **request)


async def train_step(model: TrainableModel, trajectories: list[Trajectory], turns: int) -> None:
    """One GRPO step on the group, every turn's tokens taken from the store."""
    for reward, trajectory in enumerate(trajectories):
        trajectory.reward = float(reward)
    result = await model.train([TrajectoryGroup(trajectories)], TrainConfig(), progress=False)
    assert result.step == 1 and result.metrics["turns_from_store"] == turns
    assert result.metrics["turns_retokenized"] == 0 and result.metrics["skipped"] == 0


# --- the anthropic SDK ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["create", "stream_events", "stream_helper"])
async def test_sdk_tool_use_round_trip_is_captured_and_trains(backend, server, tiny_model_path, mode) -> None:
    model = await scripted_model(backend, tiny_model_path, f"sdk-{mode}", [hermes("add", a=2, b=3), ANSWER])
    client = client_of(server)
    trajectories = []
    for _ in range(2):
        async with art.rollout() as trajectory:
            first, final = await tool_round_trip(client, model.name, mode)
        trajectories.append(trajectory)

    use = first.content[-1]
    assert (first.model, first.stop_reason, use.type, use.name, use.input) == (
        f"{model.name}@0",
        "tool_use",
        "tool_use",
        "add",
        {"a": 2, "b": 3},
    )
    assert (final.content[0].type, final.content[0].text, final.stop_reason) == ("text", ANSWER, "end_turn")
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
    call = trajectory.messages[2].tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (use.id, "add", {"a": 2, "b": 3})
    assert (trajectory.messages[3].content, trajectory.messages[4].content) == ("5", ANSWER)
    assert trajectory.tools == [
        {
            "type": "function",
            "function": {"name": "add", "parameters": ADD["input_schema"], "description": ADD["description"]},
        }
    ]
    # the message id is the token-store key, also given as `completion_id` (kept by the SDK as an extra field)
    assert (
        [t.completion_id for t in trajectory.turns]
        == [first.id, final.id]
        == [first.completion_id, final.completion_id]
    )
    assert first.id.startswith("msg_") and [t.model for t in trajectory.turns] == [f"{model.name}@0"] * 2

    await train_step(model, trajectories, turns=4)
    again = await create(client, mode, model=model.name, max_tokens=64, messages=HI)
    assert (again.model, again.stop_reason) == (f"{model.name}@1", "end_turn")


async def test_text_streams_as_it_is_sampled(backend, server, tiny_model_path) -> None:
    model = await scripted_model(backend, tiny_model_path, "sdk-deltas", [ANSWER])
    stream = await client_of(server).messages.create(model=model.name, max_tokens=16, messages=HI, stream=True)
    events = [event async for event in stream]
    deltas = [e.delta.text for e in events if e.type == "content_block_delta"]
    assert [e.type for e in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * len(deltas),
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert len(deltas) > 1 and "".join(deltas) == ANSWER
    assert events[-2].usage.input_tokens == events[0].message.usage.input_tokens > 0


async def test_stop_sequences_and_max_tokens_say_why_the_reply_ended(backend, server, tiny_model_path) -> None:
    """Greedy sampling on the tiny random model: a stop sequence taken from its own reply cuts the same reply."""
    model = TrainableModel(name="sdk-greedy", project="tests", base_model=str(tiny_model_path))
    await model.register(backend)
    client = client_of(server)
    request = {"model": model.name, "messages": HI, "temperature": 0.0}
    full = await create(client, "create", max_tokens=12, **request)
    assert (full.stop_reason, full.usage.output_tokens) == ("max_tokens", 12)
    text = full.content[0].text
    stop = text[len(text) // 2 :][:3]
    for mode in ("create", "stream_events", "stream_helper"):
        cut = await create(client, mode, max_tokens=12, stop_sequences=["never-sampled", stop], **request)
        assert (cut.stop_reason, cut.stop_sequence, cut.content[0].text) == (
            "stop_sequence",
            stop,
            text[: text.index(stop)],
        )


async def test_thinking_switches_the_chat_templates_thinking(backend, server, tiny_model_path) -> None:
    """Qwen3's template opens an empty think block when thinking is off: the prompt grows by its tokens."""
    model = await scripted_model(backend, tiny_model_path, "sdk-thinking", [ANSWER])
    client = client_of(server)
    sizes = {}
    for kind in ("enabled", "disabled"):
        thinking = {"type": kind, "budget_tokens": 1024} if kind == "enabled" else {"type": kind}
        reply = await client.messages.create(model=model.name, max_tokens=16, messages=HI, thinking=thinking)
        sizes[kind] = reply.usage.input_tokens
    assert sizes["disabled"] > sizes["enabled"]


@pytest.mark.parametrize("mode", ["create", "stream_events", "stream_helper"])
async def test_reasoning_comes_back_as_a_thinking_block_and_goes_back_as_reasoning_content(
    backend, server, tiny_model_path, mode
) -> None:
    thought = "<think>\nI should add.\n</think>\n\n"
    model = await scripted_model(backend, tiny_model_path, f"sdk-reasoning-{mode}", [thought + hermes("add", a=2, b=3)])
    client = client_of(server)
    async with art.rollout() as trajectory:
        first = await create(client, mode, model=model.name, max_tokens=64, messages=[QUESTION], tools=[ADD])
        result = {"type": "tool_result", "tool_use_id": first.content[1].id, "content": "5"}
        follow_up = [QUESTION, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]
        await create(client, mode, model=model.name, max_tokens=64, messages=follow_up, tools=[ADD])
    thinking, use = first.content
    assert (thinking.type, thinking.thinking, use.type, use.input) == (
        "thinking",
        "I should add.",
        "tool_use",
        {"a": 2, "b": 3},
    )
    sent_back = trajectory.messages[1]
    assert (sent_back.reasoning_content, sent_back.tool_calls[0].id) == ("I should add.", use.id)


async def test_a_rollout_scoped_url_captures_an_anthropic_client(backend, server, tiny_model_path) -> None:
    """An agent elsewhere gets `<server>/r/<rollout id>` as its Anthropic base URL (the SDK appends /v1/messages)."""
    model = await scripted_model(backend, tiny_model_path, "sdk-scoped", [ANSWER])
    async with art.rollout() as trajectory:
        scoped = (await model.rollout_base_url()).removesuffix("/v1")
        reply = await client_of(scoped).messages.create(model=model.name, max_tokens=16, messages=HI)
    assert [(m.role, m.content) for m in trajectory.messages] == [("user", "hi"), ("assistant", ANSWER)]
    assert trajectory.turns[0].completion_id == reply.id
    with pytest.raises(anthropic.NotFoundError, match="rollout"):  # the URL takes no calls once the rollout ended
        await client_of(scoped).messages.create(model=model.name, max_tokens=16, messages=HI)


def tool_result_of(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": content}]}]


def user_block(block: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [block]}]


REFUSALS = {
    "top_k": ({"top_k": 5}, "top_k=5 is not supported"),
    "tool_choice_any": ({"tool_choice": {"type": "any"}, "tools": [ADD]}, "tool_choice type 'any' is not supported"),
    "tool_choice_tool": (
        {"tool_choice": {"type": "tool", "name": "add"}, "tools": [ADD]},
        "tool_choice type 'tool' is not supported",
    ),
    "web_search": (
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "tools[0] has type 'web_search_20250305'",
    ),
    "bash": ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0] has type 'bash_20250124'"),
    "strict_tool": ({"tools": [{**ADD, "strict": True}]}, "tools[0].strict=true is not supported"),
    "five_stops": ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
    "temperature": ({"temperature": 1.5}, "temperature"),
    "thinking": ({"thinking": {"type": "sometimes"}}, "thinking type 'sometimes'"),
    "output_format": ({"output_config": {"format": {"type": "json_schema", "schema": {}}}}, "output_config="),
    "image": (
        {"messages": user_block({"type": "image", "source": {"type": "url", "url": "x"}})},
        "messages[0].content[0]: image blocks are not supported",
    ),
    "document": (
        {"messages": user_block({"type": "document", "source": {"type": "text", "data": "x"}})},
        "messages[0].content[0]: document blocks are not supported",
    ),
    "image_result": (
        {"messages": tool_result_of([{"type": "image"}])},
        "messages[0].content[0].content[0]: image blocks are not supported",
    ),
    "redacted_thinking": (
        {"messages": [*HI, {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}, *HI]},
        "messages[1].content[0]: block type 'redacted_thinking' is not supported",
    ),
    "system_role": ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role='system'"),
    "prefill": ({"messages": [*HI, {"role": "assistant", "content": "It is"}]}, "messages[1] is an assistant message"),
}


@pytest.mark.parametrize(("fields", "named"), REFUSALS.values(), ids=REFUSALS.keys())
async def test_refusals_name_the_field_in_anthropics_shape(backend, server, tiny_model_path, fields, named) -> None:
    model = await scripted_model(backend, tiny_model_path, "sdk-refusals", [ANSWER])
    request = {"model": model.name, "max_tokens": 16, "messages": HI, **fields}
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client_of(server).messages.create(**sdk_arguments(request))
    assert refused.value.status_code == 400 and named in refused.value.message
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "invalid_request_error"
    async with httpx.AsyncClient(base_url=server) as http:  # streamed: refused before any event
        response = await http.post("/v1/messages", json={**request, "stream": True})
    assert response.status_code == 400 and named in response.json()["error"]["message"]


async def test_missing_max_tokens_and_unknown_models_are_refused_in_anthropics_shape(server) -> None:
    async with httpx.AsyncClient(base_url=server) as http:
        missing = await http.post("/v1/messages", json={"model": "nobody", "messages": HI})
        unknown = await http.post("/v1/messages", json={"model": "nobody", "max_tokens": 8, "messages": HI})
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
    assert "'nobody' is not registered" in unknown.json()["error"]["message"]


async def test_x_api_key_guards_the_route_and_anthropic_headers_are_accepted(tmp_path, tiny_model_path) -> None:
    with start_server(tmp_path / "art", api_key="k") as url:
        backend = RemoteBackend(url, api_key="k")
        model = await scripted_model(backend, tiny_model_path, "keyed", [ANSWER])
        beta = {"anthropic-beta": "prompt-caching-2024-07-31,interleaved-thinking-2025-05-14"}
        reply = await client_of(url, api_key="k", default_headers=beta).messages.create(
            model=model.name, max_tokens=16, messages=HI, metadata={"user_id": "u1"}
        )
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await client_of(url, api_key="wrong").messages.create(model=model.name, max_tokens=16, messages=HI)
        await backend.close()
    assert reply.content[0].text == ANSWER and refused.value.status_code == 401


# --- LangChain's ChatAnthropic and LiteLLM's anthropic provider ---------------------------------


@pytest.mark.parametrize("streaming", [False, True])
async def test_chat_anthropic_agent_is_captured_inside_a_rollout_and_trains(
    backend, server, tiny_model_path, streaming
) -> None:
    from langchain_anthropic import ChatAnthropic

    name = f"lc-anthropic-{streaming}"
    model = await scripted_model(backend, tiny_model_path, name, [hermes("add", a=2, b=3), ANSWER])
    llm = ChatAnthropic(base_url=server, api_key="x", model=name, max_tokens=64, max_retries=0, streaming=streaming)
    agent = react_agent(llm, "create_agent")
    trajectories = []
    for _ in range(2):
        async with art.rollout() as trajectory:
            state = await agent.ainvoke({"messages": [("user", ASK)]})
        trajectories.append(trajectory)
    assert [m.type for m in state["messages"]] == ["human", "ai", "tool", "ai"]
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
    call = trajectory.messages[2].tool_calls[0]
    assert (call.id, call.function.name) == (state["messages"][1].tool_calls[0]["id"], "add")
    assert (trajectory.messages[3].content, trajectory.messages[4].content) == ("5", ANSWER)
    assert [t.model for t in trajectory.turns] == [f"{name}@0"] * 2 and all(t.completion_id for t in trajectory.turns)
    assert {tool["function"]["name"] for tool in trajectory.tools} == {"add", "multiply"}
    await train_step(model, trajectories, turns=4)


async def test_wrapped_chat_anthropic_agent_is_captured_once_with_its_nodes(backend, server, tiny_model_path) -> None:
    """`wrap()` records the call from LangChain's callbacks under the message id, which is the token-store key, so
    the server's copy of the call is recognised and not added twice."""
    from langchain_anthropic import ChatAnthropic

    from art_agents.integrations.langgraph import MissingCallsWarning, wrap

    model = await scripted_model(backend, tiny_model_path, "lc-wrapped", [hermes("add", a=2, b=3), ANSWER])
    llm = ChatAnthropic(base_url=server, api_key="x", model=model.name, max_tokens=64, max_retries=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingCallsWarning)
        trajectory, state = await wrap(react_agent(llm, "create_agent"), model=model).ainvoke(
            {"messages": [("user", ASK)]}
        )
    assert [(t.span, t.completion_id) for t in trajectory.turns] == [
        ("model", state["messages"][1].response_metadata["id"]),
        ("model", state["messages"][3].response_metadata["id"]),
    ]


async def test_wrapped_streaming_chat_anthropic_agent_is_captured_once(backend, server, tiny_model_path) -> None:
    """Under `wrap()`, a streamed call loses its id in LangChain, so the callback records it without one; the server's
    copy, assembled when the rollout ends, names that turn instead of adding a second one."""
    from langchain_anthropic import ChatAnthropic

    from art_agents.integrations.langgraph import MissingCallsWarning, wrap

    model = await scripted_model(backend, tiny_model_path, "lc-wrapped-stream", [hermes("add", a=2, b=3), ANSWER])
    llm = ChatAnthropic(base_url=server, api_key="x", model=model.name, max_tokens=64, max_retries=0, streaming=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", MissingCallsWarning)
        trajectory, _ = await wrap(react_agent(llm, "create_agent"), model=model).ainvoke({"messages": [("user", ASK)]})
    assert len(trajectory.turns) == 2 and all(t.completion_id and t.policy_step == 0 for t in trajectory.turns)


@pytest.mark.slow  # LiteLLM's import and two providers' round trips: proof with the real client, run in CI
@pytest.mark.parametrize("stream", [False, True])
async def test_litellm_anthropic_provider_is_captured_and_trains(backend, server, tiny_model_path, stream) -> None:
    import litellm

    name = f"litellm-anthropic-{stream}"
    model = await scripted_model(backend, tiny_model_path, name, [hermes("add", a=2, b=3), ANSWER])
    tool = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": ADD["input_schema"]}}
    request = {"model": f"anthropic/{name}", "api_base": server, "api_key": "x", "max_tokens": 64, "tools": [tool]}

    async def ask(messages: list[dict[str, Any]]) -> Any:
        reply = await litellm.acompletion(messages=messages, stream=stream, **request)
        if stream:
            reply = litellm.stream_chunk_builder([chunk async for chunk in reply], messages=messages)
        return reply.choices[0].message

    trajectories = []
    for _ in range(2):
        async with art.rollout() as trajectory:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "You add."},
                {"role": "user", "content": ASK},
            ]
            first = await ask(messages)
            call = first.tool_calls[0]
            messages += [first.model_dump(), {"role": "tool", "tool_call_id": call.id, "content": "5"}]
            final = await ask(messages)
        trajectories.append(trajectory)
    assert (call.function.name, json.loads(call.function.arguments), final.content) == ("add", {"a": 2, "b": 3}, ANSWER)
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert trajectory.messages[2].tool_calls[0].id == call.id and trajectory.messages[3].content == "5"
    assert [t.model for t in trajectory.turns] == [f"{name}@0"] * 2 and all(t.completion_id for t in trajectory.turns)
    await train_step(model, trajectories, turns=4)


# --- the format's parts -------------------------------------------------------------------------


def test_a_conversation_in_blocks_becomes_the_chat_form() -> None:
    request = MessagesRequest(
        model="m",
        max_tokens=8,
        system=[
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Add."},
        ],
        messages=[
            QUESTION,
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                    {"type": "text", "text": "Adding."},
                    {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2, "b": 3}},
                    {"type": "tool_use", "id": "t2", "name": "add", "input": {"a": 0, "b": 0}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Here you go."},
                    {"type": "tool_result", "tool_use_id": "t1", "content": "5"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [{"type": "text", "text": "bad"}],
                        "is_error": True,
                    },
                ],
            },
        ],
        tools=[ADD],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        thinking={"type": "disabled"},
        stop_sequences=["END"],
        top_p=0.9,
        metadata={"user_id": "u"},
    )
    assert chat_body(request) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief.\n\nAdd."},
            {"role": "user", "content": ASK},
            {
                "role": "assistant",
                "content": "Adding.",
                "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
                    {"id": "t2", "type": "function", "function": {"name": "add", "arguments": '{"a": 0, "b": 0}'}},
                ],
                "reasoning_content": "Use the tool.",
            },
            {"role": "tool", "tool_call_id": "t1", "content": "5"},
            {"role": "tool", "tool_call_id": "t2", "content": "Error: bad"},
            {"role": "user", "content": "Here you go."},
        ],
        "max_tokens": 8,
        "top_p": 0.9,
        "stop": ["END"],
        "stream": False,
        "tools": [
            {
                "type": "function",
                "function": {"name": "add", "parameters": ADD["input_schema"], "description": "Add two integers."},
            }
        ],
        "tool_choice": "auto",
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_a_reply_becomes_thinking_text_and_tool_use_blocks() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    broken = {"id": "c2", "type": "function", "function": {"name": "add", "arguments": "{not json"}}
    message = {"role": "assistant", "content": "Sure.", "reasoning_content": "Hm.", "tool_calls": [call, broken]}
    assert content_blocks(message) == [
        {"type": "thinking", "thinking": "Hm.", "signature": ""},
        {"type": "text", "text": 'Sure.<tool_call>{"name": "add", "arguments": "{not json"}</tool_call>'},
        {"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 1}},
    ]
    assert content_blocks({"role": "assistant", "content": None}) == [{"type": "text", "text": ""}]


async def test_a_generation_that_fails_after_the_200_ends_the_stream_with_an_error_event() -> None:
    plan = SimpleNamespace(completion_id="msg_1", served_as="m@0", prompt_ids=[1, 2])

    async def failing() -> AsyncIterator[Any]:
        raise RuntimeError("the engine died")
        yield  # an async generator

    events = [e async for e in message_events(plan, StreamDelta(0, "Hel", "msg_1", "m@0"), failing())]  # type: ignore[arg-type]
    names = [e.split("\n")[0] for e in events]
    assert names == ["event: message_start", "event: content_block_start", "event: content_block_delta", "event: error"]
    error = json.loads(events[-1].split("data: ", 1)[1])
    assert error == {"type": "error", "error": {"type": "api_error", "message": "RuntimeError: the engine died"}}


# --- a real model -------------------------------------------------------------------------------


@pytest.mark.slow
async def test_smollm2_serves_messages_that_are_captured_and_train(tmp_path: Path) -> None:
    from benchmark_scripts import load_benchmark

    folder, gguf_file = load_benchmark("bench_setup").smollm2_gguf()
    with start_server(tmp_path / "art") as url:
        backend = RemoteBackend(url)
        config = ModelConfig(gguf_file=gguf_file, lora_rank=8, lora_alpha=16, default_max_tokens=24)
        model = TrainableModel(name="smol", project="messages", base_model=folder, config=config)
        await model.register(backend)
        client = client_of(url)
        trajectories, replies = [], []
        for mode in ("create", "stream_helper"):
            async with art.rollout() as trajectory:
                reply = await create(
                    client,
                    mode,
                    model=model.name,
                    max_tokens=24,
                    system="Be brief.",
                    messages=[{"role": "user", "content": "Name a colour."}],
                )
            trajectories.append(trajectory)
            replies.append(reply)
        await train_step(model, trajectories, turns=2)
        after = await create(client, "stream_events", model=model.name, max_tokens=8, messages=HI)
        await backend.close()
    for reply, trajectory in zip(replies, trajectories, strict=True):
        assert reply.model == "smol@0" and reply.stop_reason in ("end_turn", "max_tokens") and reply.content[0].text
        assert [m.role for m in trajectory.messages] == ["system", "user", "assistant"]
        assert trajectory.messages[2].content == reply.content[0].text and trajectory.turns[0].completion_id == reply.id
    assert after.model == "smol@1"

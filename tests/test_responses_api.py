"""The OpenAI Responses API on the real server (scripted engine: real tokenizer, parsing, token store, training),
through the real clients: the `openai` SDK (JSON, raw event stream, the stream helper), openai-agents with a
function tool and an MCP tool, and LangChain's `ChatOpenAI(use_responses_api=True)`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from mcp_fixtures import KV_COMMAND
from openai import AsyncOpenAI
from server_fixtures import hermes, scripted_model

import art_agents as art
from art_agents import ModelConfig, RemoteBackend, TrainableModel, TrainConfig, TrajectoryGroup
from art_agents.server.errors import ServiceError
from art_agents.server.formats.response_store import Conversations
from art_agents.server.formats.responses import LOGPROBS

SYSTEM = "You are a calculator. Use the tools."
QUESTION = "What is 2 + 3?"
ANSWER = "The answer is 5."
TASK = "Add 2 and 3, then store the sum under x."
ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
}
CHAT_ADD = {"type": "function", "function": {key: ADD[key] for key in ("name", "description", "parameters")}}


def text_of(content: str | list[dict[str, Any]] | None) -> str:
    """A message's text, whether a string or text parts (openai-agents' chat model sends an MCP result as parts)."""
    return content if isinstance(content, str) else "".join(part["text"] for part in content or [])


@pytest.fixture
async def client(server: str) -> Any:
    client = AsyncOpenAI(base_url=f"{server}/v1", api_key="x")
    yield client
    await client.close()


async def respond(client: AsyncOpenAI, mode: str, **request: Any) -> Any:
    """One response, asked for as JSON (`create`), as a raw event stream (`stream`), or through the stream helper."""
    if mode == "create":
        return await client.responses.create(**request)
    if mode == "stream":
        events = [event async for event in await client.responses.create(stream=True, **request)]
        assert [event.sequence_number for event in events] == list(range(len(events)))
        assert [event.type for event in events[:2]] == ["response.created", "response.in_progress"]
        assert events[-1].type in ("response.completed", "response.incomplete")
        return events[-1].response
    async with client.responses.stream(**request) as stream:
        async for _ in stream:
            pass
        return await stream.get_final_response()


async def add_rollout(client: AsyncOpenAI, mode: str, name: str) -> tuple[art.Trajectory, list[Any]]:
    """A rollout that asks, gets a function call, sends its output back and gets the answer."""
    async with art.rollout() as trajectory:
        ask = [{"role": "user", "content": QUESTION}]
        first = await respond(client, mode, model=name, instructions=SYSTEM, input=ask, tools=[ADD])
        call = first.output[0]
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
        second = await respond(
            client, mode, model=name, instructions=SYSTEM, input=[*ask, *first.output, result], tools=[ADD]
        )
    return trajectory, [first, second]


@pytest.mark.parametrize("mode", ["create", "stream", "helper"])
async def test_a_function_call_round_trip_is_captured_and_trains(backend, tiny_model_path, client, mode) -> None:
    model = await scripted_model(backend, tiny_model_path, f"resp-{mode}", [hermes("add", a=2, b=3), ANSWER])
    trajectories = []
    for reward in (1.0, 0.0):
        trajectory, (first, second) = await add_rollout(client, mode, model.name)
        trajectory.reward = reward
        trajectories.append(trajectory)
    [call] = first.output
    assert (call.type, call.name, call.status) == ("function_call", "add", "completed")
    assert json.loads(call.arguments) == {"a": 2, "b": 3}
    assert second.output_text == ANSWER and second.status == "completed"
    assert (first.model, second.model) == (f"{model.name}@0",) * 2
    assert first.id.startswith("resp_") and first.completion_id == first.id  # the token-store key
    usage = second.usage
    assert usage.input_tokens > first.usage.input_tokens and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens

    messages = trajectory.messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert (messages[0].content, messages[1].content) == (SYSTEM, QUESTION)
    assert messages[2].tool_calls[0].id == call.call_id and messages[2].tool_calls[0].function.name == "add"
    assert (messages[3].tool_call_id, messages[3].content, messages[4].content) == (call.call_id, "5", ANSWER)
    assert trajectory.tools == [CHAT_ADD]
    assert [(t.completion_id, t.model) for t in trajectory.turns] == [
        (first.completion_id, f"{model.name}@0"),
        (second.completion_id, f"{model.name}@0"),
    ]

    result = await model.train([TrajectoryGroup(trajectories)], TrainConfig(), progress=False)
    assert result.step == 1 and result.metrics["turns_from_store"] == 4 and result.metrics["turns_retokenized"] == 0
    _, (after, _) = await add_rollout(client, mode, model.name)
    assert after.model == f"{model.name}@1"


async def test_streamed_text_arrives_as_deltas_in_responses_events(backend, tiny_model_path, server) -> None:
    model = await scripted_model(backend, tiny_model_path, "resp-deltas", [ANSWER])
    async with httpx.AsyncClient(base_url=server, timeout=60) as http:
        request = {"model": model.name, "input": QUESTION, "stream": True}
        async with http.stream("POST", "/v1/responses", json=request) as reply:
            lines = [line async for line in reply.aiter_lines() if line]
    kinds = [line.removeprefix("event: ") for line in lines[0::2]]
    events = [json.loads(line.removeprefix("data: ")) for line in lines[1::2]]
    assert [event["type"] for event in events] == kinds
    deltas = kinds.count("response.output_text.delta")
    assert deltas > 1 and kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    text = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert text == ANSWER == final["output"][0]["content"][0]["text"]
    assert events[0]["response"]["id"] == final["id"] and final["model"] == f"{model.name}@0"
    assert {event.get("item_id") for event in events[3:-2]} == {final["output"][0]["id"]}


REFUSED = [
    ({"background": True}, "background=True is not supported"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type='web_search' is not supported"),
    ({"text": {"format": {"type": "json_object"}}}, "text.format type='json_object' is not supported"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort='high' is not supported"),
    ({"include": ["reasoning.encrypted_content"]}, "include='reasoning.encrypted_content' is not supported"),
    ({"tool_choice": "required", "tools": [ADD]}, "tool_choice='required' is not supported"),
    ({"tool_choice": {"type": "function", "name": "add"}, "tools": [ADD]}, "tool_choice={'type': 'function'"),
    ({"truncation": "auto"}, "truncation='auto' is not supported"),
    ({"conversation": "conv_1"}, "conversation='conv_1' is not supported"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt={'id': 'pmpt_1'} is not supported"),
    ({"top_logprobs": 3}, "top_logprobs=3 is not supported"),
    ({"extra_body": {"top_k": 5}}, "top_k=5 is not supported"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate=1 is not supported"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type='item_reference' is not supported"),
    ({"input": [{"type": "function_call_output", "output": "5"}]}, "input[0].call_id is missing"),
    ({"tools": [ADD] * 129}, "tools: List should have at most 128 items"),  # the chat route's limit, in chat form
]


@pytest.mark.parametrize(("request_", "named"), REFUSED, ids=[named.split("=")[0] for _, named in REFUSED])
async def test_fields_the_server_cannot_honour_are_refused_by_name(backend, tiny_model_path, client, request_, named):
    model = await scripted_model(backend, tiny_model_path, "resp-refusals", [ANSWER])
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(**{"model": model.name, "input": QUESTION, **request_})
    assert named in refused.value.message
    assert refused.value.body["type"] == "invalid_request_error"


async def test_harmless_fields_and_their_neutral_values_are_accepted(backend, tiny_model_path, client) -> None:
    model = await scripted_model(backend, tiny_model_path, "resp-neutral", [ANSWER])
    response = await client.responses.create(
        model=model.name,
        input=[{"type": "message", "role": "developer", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        metadata={"run": "1"},
        user="u",
        service_tier="auto",
        parallel_tool_calls=False,
        store=True,
        text={"format": {"type": "text"}},
        reasoning={"summary": "auto"},
        truncation="disabled",
        background=False,
        tool_choice="auto",
    )
    assert response.output_text == ANSWER and response.metadata == {"run": "1"}
    assert response.parallel_tool_calls is False


async def test_unknown_models_and_response_ids_are_not_found(backend, tiny_model_path, client) -> None:
    model = await scripted_model(backend, tiny_model_path, "resp-unknown", [ANSWER])
    with pytest.raises(openai.NotFoundError, match="model 'nobody' is not registered"):
        await client.responses.create(model="nobody", input=QUESTION)
    with pytest.raises(openai.NotFoundError, match=r"previous_response_id='resp_gone' is unknown"):
        await client.responses.create(model=model.name, input=QUESTION, previous_response_id="resp_gone")
    unstored = await client.responses.create(model=model.name, input=QUESTION, store=False)
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        await client.responses.create(model=model.name, input="more", previous_response_id=unstored.id)


def test_kept_conversations_are_bounded_in_number_and_size() -> None:
    conversations = Conversations(limit=2, max_chars=200)
    hi = [{"role": "user", "content": "hi"}]
    for rid in ("a", "b", "c"):
        conversations.keep(rid, hi)
    with pytest.raises(ServiceError, match="previous_response_id='a' is unknown"):
        conversations.history("a")
    assert conversations.history("b") == hi  # used: now the most recent
    conversations.keep("d", hi)
    with pytest.raises(ServiceError):
        conversations.history("c")
    conversations.keep("huge", [{"role": "user", "content": "x" * 300}])
    for rid in ("b", "d", "huge"):  # nothing is kept beyond max_chars, not even the newest
        with pytest.raises(ServiceError):
            conversations.history(rid)


async def test_previous_response_id_continues_the_conversation(backend, tiny_model_path, client) -> None:
    model = await scripted_model(backend, tiny_model_path, "resp-previous", [hermes("add", a=2, b=3), ANSWER, "Ten."])
    async with art.rollout() as trajectory:
        first = await client.responses.create(model=model.name, instructions=SYSTEM, input=QUESTION, tools=[ADD])
        [call] = first.output
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
        second = await client.responses.create(
            model=model.name, instructions=SYSTEM, input=[result], tools=[ADD], previous_response_id=first.id
        )
        third = await client.responses.create(
            model=model.name, input="And 5 + 5?", previous_response_id=second.id, instructions="Be brief."
        )
    assert (second.output_text, third.output_text) == (ANSWER, "Ten.")
    assert third.previous_response_id == second.id
    assert [(m.role, m.content) for m in trajectory.messages][:2] == [("system", SYSTEM), ("user", QUESTION)]
    [brief] = trajectory.additional_histories  # the instructions of earlier responses are not carried over
    assert [(m.role, m.content) for m in brief.messages] == [
        ("system", "Be brief."),
        ("user", QUESTION),
        ("assistant", None),
        ("tool", "5"),
        ("assistant", ANSWER),
        ("user", "And 5 + 5?"),
        ("assistant", "Ten."),
    ]
    assert brief.messages[2].tool_calls[0].id == call.call_id
    assert [(t.history, t.completion_id) for t in trajectory.turns] == [
        (0, first.completion_id),
        (0, second.completion_id),
        (1, third.completion_id),
    ]


@pytest.mark.parametrize("mode", ["create", "helper"])
async def test_reasoning_comes_back_as_a_reasoning_item_and_goes_back_as_reasoning_content(
    backend, tiny_model_path, client, mode
) -> None:
    thought = "<think>\nI should add.\n</think>\n\n"
    model = await scripted_model(
        backend, tiny_model_path, f"resp-reasoning-{mode}", [thought + hermes("add", a=2, b=3)]
    )
    async with art.rollout() as trajectory:
        first = await respond(client, mode, model=model.name, input=QUESTION, tools=[ADD])
        result = {"type": "function_call_output", "call_id": first.output[1].call_id, "output": "5"}
        ask = [{"role": "user", "content": QUESTION}]
        await client.responses.create(model=model.name, input=[*ask, *first.output, result], tools=[ADD])
    reasoning, call = first.output
    assert (reasoning.type, reasoning.content[0].text, call.type) == ("reasoning", "I should add.", "function_call")
    sent_back = trajectory.messages[1]
    assert (sent_back.reasoning_content, sent_back.tool_calls[0].id) == ("I should add.", call.call_id)


async def test_a_reply_cut_by_max_output_tokens_is_incomplete(backend, tiny_model_path, client) -> None:
    model = await scripted_model(backend, tiny_model_path, "resp-incomplete", [ANSWER])
    for mode in ("create", "stream"):
        response = await respond(client, mode, model=model.name, input=QUESTION, max_output_tokens=2)
        assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")
        assert response.usage.output_tokens == 2 and response.output[0].status == "incomplete"


async def test_logprobs_come_with_the_text_when_included(backend, tiny_model_path, client) -> None:
    model = await scripted_model(backend, tiny_model_path, "resp-logprobs", [ANSWER])
    for mode in ("create", "helper"):
        response = await respond(client, mode, model=model.name, input=QUESTION, include=[LOGPROBS])
        logprobs = response.output[0].content[0].logprobs
        assert len(logprobs) == response.usage.output_tokens and all(lp.logprob <= 0 for lp in logprobs)
    plain = await client.responses.create(model=model.name, input=QUESTION)
    assert plain.output[0].content[0].logprobs == []


async def test_a_generation_that_fails_mid_stream_ends_in_an_error_event(
    backend, tiny_model_path, client, monkeypatch
) -> None:
    from art_agents.server.engines.scripted_engine import ScriptedEngine

    model = await scripted_model(backend, tiny_model_path, "resp-failing", [ANSWER])

    def fall_over(self: ScriptedEngine, request: Any, choice: int, step: int) -> None:
        request.streamed = True
        for token in self.tokenizer.encode("The answer is", add_special_tokens=False):
            request.on_token(choice, token)
        raise RuntimeError("the engine fell over")

    monkeypatch.setattr(ScriptedEngine, "_scripted", fall_over)
    events = [event async for event in await client.responses.create(model=model.name, input=QUESTION, stream=True)]
    assert "response.output_text.delta" in [event.type for event in events]
    assert events[-1].type == "error" and "RuntimeError: the engine fell over" in events[-1].message
    assert events[-1].sequence_number == len(events) - 1


@pytest.mark.slow  # an MCP server over stdio per run: proof with the real SDK, run in CI
@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_an_openai_agents_run_with_a_function_tool_and_an_mcp_tool_is_captured_and_trains(
    backend, tiny_model_path, client, api
) -> None:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.mcp import MCPServerStdio, create_static_tool_filter

    set_tracing_disabled(True)
    script = [
        hermes("add", a=2, b=3),
        '<tool_call>\n{"name": "put", "arguments": {"key": "x", "value": "5"}}\n</tool_call>',
        "Stored 5.",
    ]
    model = await scripted_model(backend, tiny_model_path, f"agents-{api}", script)

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    params = {"command": KV_COMMAND[0], "args": KV_COMMAND[1:]}
    tool_filter = create_static_tool_filter(allowed_tool_names=["put", "get"])
    trajectories = []
    async with MCPServerStdio(params=params, tool_filter=tool_filter, cache_tools_list=True) as kv:
        agent = Agent(
            name="calculator",
            instructions=SYSTEM,
            tools=[add],
            mcp_servers=[kv],
            model=kind(model=model.name, openai_client=client),
        )
        for reward in (1.0, 0.0):
            async with art.rollout() as trajectory:
                result = await Runner.run(agent, TASK)
            trajectory.reward = reward
            trajectories.append(trajectory)
        trained = await model.train([TrajectoryGroup(trajectories)], TrainConfig(), progress=False)
        async with art.rollout() as after:  # streamed this time
            streamed = Runner.run_streamed(agent, TASK)
            async for _ in streamed.stream_events():
                pass
    assert result.final_output == "Stored 5."
    trajectory = trajectories[0]
    assert [m.role for m in trajectory.messages] == ["system", "user", *["assistant", "tool"] * 2, "assistant"]
    assert [m.tool_calls[0].function.name for m in trajectory.messages[2:6:2]] == ["add", "put"]
    assert [text_of(m.content) for m in trajectory.messages[3:6:2]] == ["5", "stored x"]
    assert {tool["function"]["name"] for tool in trajectory.tools} == {"add", "put", "get"}
    assert [t.model for t in trajectory.turns] == [f"{model.name}@0"] * 3
    assert all(t.completion_id for t in trajectory.turns)
    assert trained.metrics["turns_from_store"] == 6 and trained.metrics["turns_retokenized"] == 0
    assert streamed.final_output == "Stored 5." and [t.model for t in after.turns] == [f"{model.name}@1"] * 3


async def test_langchain_chat_openai_on_the_responses_api_is_captured(backend, tiny_model_path, server) -> None:
    from langchain_core.messages import ToolMessage
    from langchain_openai import ChatOpenAI

    model = await scripted_model(backend, tiny_model_path, "resp-langchain", [hermes("add", a=2, b=3), ANSWER])
    llm = ChatOpenAI(model=model.name, base_url=f"{server}/v1", api_key="x", use_responses_api=True)
    tools = llm.bind_tools([ADD])
    async with art.rollout() as trajectory:
        ask = [("system", SYSTEM), ("user", QUESTION)]
        call = await tools.ainvoke(ask)
        [tool_call] = call.tool_calls
        reply = await tools.ainvoke([*ask, call, ToolMessage("5", tool_call_id=tool_call["id"])])
    assert (tool_call["name"], tool_call["args"]) == ("add", {"a": 2, "b": 3})
    assert reply.text == ANSWER and reply.response_metadata["model_name"] == f"{model.name}@0"
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert trajectory.messages[2].tool_calls[0].id == tool_call["id"] and trajectory.messages[3].content == "5"
    assert len(trajectory.turns) == 2 and all(t.completion_id for t in trajectory.turns)


# --- a real model -------------------------------------------------------------------------------


@pytest.mark.slow
async def test_smollm2_serves_responses_that_are_captured_and_train(tmp_path: Path) -> None:
    from benchmark_scripts import load_benchmark
    from server_fixtures import start_server

    folder, gguf_file = load_benchmark("bench_setup").smollm2_gguf()
    with start_server(tmp_path / "art") as url:
        backend = RemoteBackend(url)
        config = ModelConfig(gguf_file=gguf_file, lora_rank=8, lora_alpha=16, default_max_tokens=24)
        model = TrainableModel(name="smol", project="responses", base_model=folder, config=config)
        await model.register(backend)
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="x")
        trajectories, replies = [], []
        for mode, reward in (("create", 1.0), ("stream", 0.0)):
            async with art.rollout() as trajectory:
                reply = await respond(client, mode, model=model.name, instructions="Be brief.", input="Name a colour.")
            trajectory.reward = reward
            trajectories.append(trajectory)
            replies.append(reply)
        trained = await model.train([TrajectoryGroup(trajectories)], TrainConfig(), progress=False)
        # not the helper: it raises on `response.incomplete`, the end of a cut reply (openai-python PR #3538)
        after = await respond(client, "stream", model=model.name, input="Hi", max_output_tokens=8)
        await client.close()
        await backend.close()
    for reply, trajectory in zip(replies, trajectories, strict=True):
        assert reply.model == "smol@0" and reply.status in ("completed", "incomplete") and reply.output_text
        assert [m.role for m in trajectory.messages] == ["system", "user", "assistant"]
        assert trajectory.messages[2].content == reply.output_text
        assert trajectory.turns[0].completion_id == reply.completion_id
    assert trained.metrics["turns_from_store"] == 2 and trained.metrics["turns_retokenized"] == 0
    assert after.model == "smol@1"


async def test_a_wrapped_langgraph_agent_on_the_responses_api_records_each_turn_once(
    backend, tiny_model_path, server
) -> None:
    """LangChain's callbacks and the server's log record each call once, under the response id (the store's key)."""
    from langchain_openai import ChatOpenAI
    from langgraph_agents import react_agent

    from art_agents.integrations.langgraph import wrap

    model = await scripted_model(backend, tiny_model_path, "resp-langgraph", [hermes("add", a=2, b=3), ANSWER])
    llm = ChatOpenAI(model=model.name, base_url=f"{server}/v1", api_key="x", use_responses_api=True)
    agent = wrap(react_agent(llm, "create_agent"), model=model)
    trajectories = []
    for reward in (1.0, 0.0):
        trajectory, _ = await agent.ainvoke({"messages": [("user", QUESTION)]})
        trajectory.reward = reward
        trajectories.append(trajectory)
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert [t.completion_id[:5] for t in trajectory.turns] == ["resp_", "resp_"]
    result = await model.train([TrajectoryGroup(trajectories)], TrainConfig(), progress=False)
    assert result.metrics["turns_from_store"] == 4 and result.metrics["turns_retokenized"] == 0

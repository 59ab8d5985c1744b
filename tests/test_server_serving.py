"""The real server on loopback, driven by the real OpenAI SDK: completions, streaming, n, tools, token store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_fixtures import ADD_TOOL, start_server

TOOL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
BROKEN_TOOL_TEXT = "<tool_call>\n{not json at all\n</tool_call>"
MESSAGES = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 1 + 2?"}]


def register(base_url: str, name: str, base_model: Path, **config: Any) -> dict[str, Any]:
    body = {"name": name, "project": "tests", "base_model": str(base_model), "config": config}
    response = httpx.post(f"{base_url}/v1/art/models", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def art_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("art")


@pytest.fixture(scope="module")
def base_url(art_path: Path, tiny_model_path: Path) -> Iterator[str]:
    with start_server(art_path) as url:
        register(url, "tiny", tiny_model_path)
        register(url, "tools", tiny_model_path, engine="scripted", scripted_responses=[TOOL_TEXT, BROKEN_TOOL_TEXT])
        yield url


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused")


def store_for(art_path: Path, name: str):
    from art_agents.server.storage.token_store import TokenStore

    return TokenStore(art_path / "tests" / "models" / name / "tokens" / "store.sqlite")


def test_completion_answers_name_at_step_and_is_recorded_exactly(
    client: openai.OpenAI, art_path: Path, tiny_model_path: Path
) -> None:
    from transformers import AutoTokenizer

    from art_agents.server.models.chat_format import render_prompt_ids

    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, seed=3)
    assert response.model == "tiny@0"
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length")
    record = store_for(art_path, "tiny").get(response.id)
    assert record is not None and record.policy_step == 0
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    assert record.prompt_ids == render_prompt_ids(tokenizer, MESSAGES, None)
    assert record.completion_ids == choice.model_extra["token_ids"]
    assert record.logprobs == [item.logprob for item in choice.logprobs.content]
    assert all(lp <= 0 for lp in record.logprobs)
    assert response.usage.completion_tokens == len(record.completion_ids) <= 12
    assert response.usage.prompt_tokens == len(record.prompt_ids)
    # the text is what the recorded tokens decode to (end-of-turn token excluded)
    end = [] if choice.finish_reason == "length" else [-1]
    ids = record.completion_ids[: end[0]] if end else record.completion_ids
    assert choice.message.content == tokenizer.decode(ids, skip_special_tokens=True)


def test_seeded_requests_repeat_and_n_gives_distinct_recorded_choices(client: openai.OpenAI, art_path: Path) -> None:
    first = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, seed=7, n=2)
    again = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, seed=7, n=2)
    assert len(first.choices) == 2
    ids = [c.model_extra["completion_id"] for c in first.choices]
    assert ids[0] == first.id and ids[1] != ids[0]
    tokens = [c.model_extra["token_ids"] for c in first.choices]
    assert tokens[0] != tokens[1]
    assert tokens == [c.model_extra["token_ids"] for c in again.choices]
    records = store_for(art_path, "tiny").get_many(ids)
    assert [records[i].completion_ids for i in ids] == tokens


def test_streaming_matches_the_non_streaming_completion(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=16, seed=11)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=16, seed=11, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert {c.model for c in chunks} == {"tiny@0"}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_tool_calls_are_parsed_and_unparseable_ones_stay_content(client: openai.OpenAI, art_path: Path) -> None:
    # the scripted engine answers the tool call, then the broken one, in order
    called = client.chat.completions.create(model="tools", messages=MESSAGES, tools=[ADD_TOOL], tool_choice="auto")
    broken = client.chat.completions.create(model="tools", messages=MESSAGES, tools=[ADD_TOOL])
    assert called.choices[0].finish_reason == "tool_calls"
    (call,) = called.choices[0].message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 2}
    assert broken.choices[0].finish_reason == "stop"
    assert broken.choices[0].message.tool_calls is None
    assert broken.choices[0].message.content == BROKEN_TOOL_TEXT
    record = store_for(art_path, "tools").get(called.id)
    assert record is not None and record.completion_ids == called.choices[0].model_extra["token_ids"]
    assert len(record.logprobs) == len(record.completion_ids) and all(lp < 0 for lp in record.logprobs)


def test_streamed_tool_call_arrives_as_tool_call_deltas(client: openai.OpenAI) -> None:
    chunks = []
    for _ in range(2):  # whichever of the two scripted answers comes first, one of them is the tool call
        chunks.append(
            list(client.chat.completions.create(model="tools", messages=MESSAGES, tools=[ADD_TOOL], stream=True))
        )
    calls = [d.tool_calls[0] for cs in chunks for c in cs if c.choices and (d := c.choices[0].delta).tool_calls]
    assert len(calls) == 1 and calls[0].function.name == "add"
    assert json.loads(calls[0].function.arguments) == {"a": 1, "b": 2}


def test_models_route_and_rollout_counting(base_url: str, client: openai.OpenAI) -> None:
    listed = {m.id: m.model_extra for m in client.models.list().data}
    assert listed["tiny"]["served_as"] == "tiny@0" and "tools" in listed
    for _ in range(2):
        client.chat.completions.create(
            model="tiny@0", messages=MESSAGES, max_tokens=2, extra_headers={"x-art-rollout-id": "rollout-42"}
        )
    assert httpx.get(f"{base_url}/v1/art/rollouts/rollout-42").json()["completions"] == 2
    assert httpx.get(f"{base_url}/v1/art/rollouts/never-seen").json()["completions"] == 0


def test_fresh_server_fixture_is_healthy_and_empty(server_url: str) -> None:
    health = httpx.get(f"{server_url}/health").json()
    assert health == {"status": "ok", "models": {}}
    assert httpx.get(f"{server_url}/openapi.json").json()["info"]["title"] == "art-agents server"


def test_stream_is_incremental_and_never_leaks_a_stop_string(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, seed=5).choices[0]
    text = full.message.content
    assert len(text) > 12, text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    expected = text[: text.index(stop)]
    stopped = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, seed=5, stop=[stop])
    assert stopped.choices[0].message.content == expected and stopped.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, seed=5, stop=[stop], stream=True)
    )
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == expected
    assert len(pieces) > 1  # sent as it is sampled, not in one piece at the end
    assert chunks[-1].choices[0].finish_reason == "stop"

"""Scenario generation through LiteLLM against a scripted local endpoint.

A generator that miscounts, breaks the JSON, breaks the schema or repeats itself is re-asked with
the problem named; the result has exactly the count asked for, without near-duplicates; a generator
that never answers usefully fails with a bounded number of requests and a clear error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from scripted_openai import ScriptedOpenAI

from art_agents.autorl.generation import GenerationError, near_duplicate
from art_agents.autorl.scenarios import ScenarioDraft, generate_scenarios, split_scenarios


def scenarios_json(*tasks: str, difficulty: int = 2) -> str:
    return json.dumps({"scenarios": [{"task": t, "difficulty": difficulty, "reference_answer": None} for t in tasks]})


def params(server: ScriptedOpenAI) -> dict[str, Any]:
    return {"api_base": server.base_url, "api_key": "sk-test", "timeout": 5}


async def test_exact_count_after_reasks_and_dropped_duplicates(scripted: ScriptedOpenAI) -> None:
    invalid = json.loads(scenarios_json("Convert 9am London time to Tokyo time", "a", "b", "c"))
    invalid["scenarios"][2]["difficulty"] = 9
    scripted.replies = [
        "Sure! Here are some tasks you could try.",  # no JSON at all
        json.dumps(invalid),  # schema broken: difficulty 9, task too short
        scenarios_json("Convert 9am London time to Tokyo time"),  # too few
        scenarios_json(
            "What time is it now in Tokyo?",
            "what time is it now in Tokyo",  # a near-duplicate of the first
            "Convert 9am London time to Tokyo time",
            "Which day of the week is it in Sydney right now?",
        ),
        scenarios_json("Is it already evening in Los Angeles?", "One more than asked for, dropped"),
    ]
    generated = await generate_scenarios(
        "openai/generator", "Tools:\n- get_current_time", 4, max_attempts=4, **_kw(scripted)
    )

    tasks = [s.task for s in generated.items]
    assert tasks == [
        "What time is it now in Tokyo?",
        "Convert 9am London time to Tokyo time",
        "Which day of the week is it in Sydney right now?",
        "Is it already evening in Los Angeles?",
    ]
    assert generated.duplicates_dropped == 1 and len(generated.calls) == 5
    problems = [c.problem for c in generated.calls]
    assert "not valid JSON" in problems[0]
    assert (
        "scenarios[1] is invalid (task:" in problems[1]
        and "difficulty: Input should be less than or equal to 5" in problems[1]
    )
    assert "holds 1 items under 'scenarios', but exactly 4 were asked for" in problems[2]
    assert problems[3] is None and problems[4] is None
    reask = scripted.requests[1]["messages"][-1]["content"]
    assert reask.startswith("Your answer could not be used: the answer is not valid JSON")
    second_round = scripted.requests[4]["messages"][-1]["content"]  # a fresh conversation asks for the one missing
    assert "exactly 1 items" in second_round and "- Which day of the week is it in Sydney right now?" in second_round
    assert len(scripted.requests[4]["messages"]) == 3
    assert generated.prompt_tokens == 50 and generated.completion_tokens == 25  # 10 + 5 per scripted call
    assert scripted.requests[0]["response_format"]["type"] == "json_schema"


async def test_a_generator_that_only_returns_garbage_fails_clearly(scripted: ScriptedOpenAI) -> None:
    scripted.default = "I cannot help with that."
    with pytest.raises(GenerationError) as raised:
        await generate_scenarios("openai/generator", "Tools:\n- x", 3, **_kw(scripted))
    message = str(raised.value)
    assert "gave no usable answer in 3 attempts" in message and "stronger generator" in message
    assert len(scripted.requests) == 3


async def test_a_generator_that_keeps_repeating_itself_stops_after_its_rounds(scripted: ScriptedOpenAI) -> None:
    scripted.default = scenarios_json("What time is it in Paris?", "What time is it in Paris, please?")
    with pytest.raises(GenerationError, match=r"gave only 1 distinct items of 2 in 4 rounds"):
        await generate_scenarios("openai/generator", "Tools:\n- x", 2, **_kw(scripted))
    assert len(scripted.requests) == 4


async def test_an_unreachable_generator_names_the_fix() -> None:
    with pytest.raises(GenerationError, match="--generator-model"):
        await generate_scenarios("nosuchprovider/model", "Tools:\n- x", 2)


def test_split_is_seeded_and_keeps_val_out_of_train() -> None:
    drafts = [ScenarioDraft(task=f"task number {i} for the agent", difficulty=1 + i % 5) for i in range(10)]
    first, again = split_scenarios(drafts, 3, seed=1), split_scenarios(drafts, 3, seed=1)
    assert first == again and sum(s.split == "val" for s in first) == 3
    assert len({s.id for s in first}) == 10
    with pytest.raises(ValueError, match="at least one training scenario"):
        split_scenarios(drafts, 10)


def test_near_duplicates_ignore_case_punctuation_and_padding_not_values() -> None:
    assert near_duplicate("What time is it in Tokyo?", "what time is it in tokyo")
    assert near_duplicate("Add 12 and 30, then double it.", "Add 12 and 30 then double it please")
    assert not near_duplicate("What time is it in Tokyo?", "What time is it in Paris?")
    assert not near_duplicate("What is 12 * 7?", "What is 12 * 9?")  # other values, another task
    weather = "It is {} outside today, so tell me what I should wear for a long walk in the city"
    assert not near_duplicate(weather.format("25C"), weather.format("95C"))  # a value stuck to its unit
    assert not near_duplicate(weather.format("2.5mm of rain"), weather.format("2.9mm of rain"))
    assert near_duplicate(weather.format("25C"), weather.format("25C,"))


def _kw(server: ScriptedOpenAI) -> dict[str, Any]:
    return {"litellm_params": params(server)}

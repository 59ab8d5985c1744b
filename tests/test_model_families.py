"""Each model family through the whole loop: render -> generate -> parse -> store -> train, in its own format.

A random model never calls a tool, so the scripted engine answers each family's real output (its tool-call
markup, its reasoning, its end-of-turn token) as token ids of the family's tokenizer; the chat template, the
parsing of those tokens into OpenAI `tool_calls` and `reasoning_content`, the token store and the trainer are
the real code. The trained sequences' masks must cover exactly the tokens the engine sampled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import start_server

import art_agents as art
from art_agents.backends.remote import RemoteBackend
from art_agents.server.ops.family_models import FAMILIES, SPECS, Family, build_family_model
from art_agents.server.storage.token_store import TokenStore
from art_agents.server.training.sequences import Policy, build_sequences
from art_agents.train_config import ModelConfig, TrainConfig

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
REASONING = "The user wants the weather."
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# What each family writes after the call's result: its final answer, ended its own way.
ANSWERS: dict[Family, str] = {
    "qwen2_5": "It is sunny.<|im_end|>",
    "qwen3": "<think>\nEasy.\n</think>\n\nIt is sunny.<|im_end|>",
    "llama3_1": "It is sunny.<|eot_id|>",
    "llama3_2": "It is sunny.<|eot_id|>",
    "gpt_oss": "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>",
    "gemma3": "It is sunny.<end_of_turn>",
    "gemma4": "It is sunny.<turn|>",
    "mistral": "It is sunny.</s>",
}
REASONS = {"qwen3", "gpt_oss", "gemma4"}  # families whose output carries reasoning, parsed apart
# Where the second prompt starts with the first prompt + the sampled call, so the two turns merge. Gemma 4's template
# drops the call's reasoning, Gemma 3's hermes fallback writes the call without the model's newlines, and Mistral's
# template writes the call back with its id, which the model did not write: their turns train as separate sequences.
MERGED = {"qwen2_5", "qwen3", "llama3_1", "llama3_2", "gpt_oss"}


def call_output(family: Family) -> str:
    """The family's own tool call; Gemma 3 has no format of its own, so it is told the hermes one (and writes it)."""
    return f"{HERMES_CALL}<end_of_turn>" if family == "gemma3" else SPECS[family].example_output


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One server for every family (its url and art path)."""
    art_path = tmp_path_factory.mktemp("families") / "art"
    with start_server(art_path) as url:
        yield url, art_path


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_tool_using_conversation_renders_parses_and_trains_in_the_familys_format(
    family: Family, server: tuple[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    url, art_path = server
    path = build_family_model(tmp_path / family, family)
    config = ModelConfig(
        engine="scripted", scripted_responses=[call_output(family), ANSWERS[family]], lora_rank=4, default_max_tokens=96
    )
    model = art.TrainableModel(name=f"fam-{family}", project="families", base_model=str(path), config=config)
    backend = RemoteBackend(url)
    await model.register(backend)
    client = model.openai_client()

    async def conversation(reward: float) -> art.Trajectory:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the weather in Paris?"},
        ]
        async with art.rollout() as trajectory:
            first = (await client.chat.completions.create(model=model.name, messages=messages, tools=TOOLS)).choices[0]  # type: ignore[arg-type]
            call = first.message.tool_calls[0]  # type: ignore[index]
            assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
            assert first.finish_reason == "tool_calls" and not (first.message.content or "").strip()
            if family in REASONS:
                assert (first.message.model_extra or {}).get("reasoning_content") == REASONING
            messages += [
                first.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees."},
            ]
            final = (await client.chat.completions.create(model=model.name, messages=messages, tools=TOOLS)).choices[0]  # type: ignore[arg-type]
            assert final.message.content == "It is sunny." and not final.message.tool_calls
            trajectory.reward = reward
        return trajectory

    group = art.TrajectoryGroup([await conversation(1.0), await conversation(0.0)])
    result = await model.train([group], TrainConfig(learning_rate=1e-3), progress=False)
    assert result.step == 1 and result.metrics["turns_from_store"] == 4 and result.metrics["turns_retokenized"] == 0
    # a call and its answer train as one sequence where the next prompt re-renders the sampled call unchanged
    assert result.metrics["sequences"] == (2 if family in MERGED else 4)

    store = TokenStore(art_path / "families" / "models" / model.name / "tokens" / "store.sqlite")
    tokenizer = AutoTokenizer.from_pretrained(path)
    sequences, _ = build_sequences(
        [group], store, tokenizer, {(0, 0): 1.0, (0, 1): -1.0}, policy=Policy(model.name, 1, 1)
    )
    records = store.get_many(turn.completion_id for t in group.trajectories for turn in t.turns if turn.completion_id)
    sampled = [records[turn.completion_id].completion_ids for t in group.trajectories for turn in t.turns]  # type: ignore[index]
    trained = [tok for s in sequences for tok, m in zip(s.token_ids, s.mask, strict=True) if m]
    assert trained == [tok for ids in sampled for tok in ids]  # the masks cover the sampled tokens, and nothing else
    store.close()
    await client.close()
    await backend.close()


BROKEN: dict[Family, str] = {  # a call cut short in each family's format
    "qwen2_5": '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call><|im_end|>',
    "qwen3": '<think>\nHm.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": \n</tool_call><|im_end|>',
    "llama3_1": '{"name": "get_weather", "parameters": {"city": <|eot_id|>',
    "llama3_2": '{"name": "get_weather", "parameters": <|eot_id|>',
    "gpt_oss": '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": <|call|>',
    "gemma3": '<tool_call>\n{"name": "get_weather", "arguments": \n</tool_call><end_of_turn>',
    "gemma4": "<|tool_call>call:get_weather{city:<tool_call|><turn|>",
    "mistral": '[TOOL_CALLS] [{"name": "get_weather", "arguments": </s>',
}


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_broken_call_in_the_familys_format_comes_back_as_plain_content(
    family: Family, server: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = server
    path = build_family_model(tmp_path / family, family)
    config = ModelConfig(engine="scripted", scripted_responses=[BROKEN[family]], lora_rank=4, default_max_tokens=96)
    model = art.TrainableModel(name=f"broken-{family}", project="families", base_model=str(path), config=config)
    backend = RemoteBackend(url)
    await model.register(backend)
    client = model.openai_client()
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    bare = [
        {"type": "function", "function": {"name": "get_weather"}}
    ]  # no description or parameters: optional in OpenAI's API
    reply = await client.chat.completions.create(model=model.name, messages=messages, tools=bare)  # type: ignore[arg-type]
    choice = reply.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    assert "get_weather" in (choice.message.content or "")  # what the model wrote, kept for training
    await client.close()
    await backend.close()


def test_gpt_oss_calls_parse_with_the_recipient_before_or_after_the_channel() -> None:
    from art_agents.server.models.chat_format import parse_assistant

    class Plain:  # no response parser: the harmony fallback alone
        eos_token = "<|return|>"

    written = (
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
    )
    message = parse_assistant(Plain(), written)
    call = message["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})
    assert message["reasoning_content"] == "Need the weather."


def doctor(path: Path) -> Any:
    """`art-agents doctor --model PATH`, run in this process."""
    from typer.testing import CliRunner

    from art_agents.cli.main import app, load_parts

    if not any(command.name == "doctor" for command in app.registered_commands):
        load_parts()
    return CliRunner().invoke(app, ["doctor", "--model", str(path)])


@pytest.mark.parametrize(
    ("family", "named", "fallback", "note"),
    [
        ("qwen3", "Qwen3", False, "drops earlier turns' reasoning"),
        ("llama3_2", "Llama 3.2", False, None),
        ("gpt_oss", "GPT-OSS", False, "harmony parser"),
        ("gemma3", "Gemma 3", True, "warm it up first with SFT"),
        ("gemma4", "Gemma 4", False, None),
        ("mistral", "Mistral", False, "9-character tool-call ids"),
    ],
)
def test_doctor_names_the_family_its_tool_rendering_parser_and_known_limits(
    family: Family, named: str, fallback: bool, note: str | None, tmp_path: Path
) -> None:
    path = build_family_model(tmp_path / family, family)
    result = doctor(path)
    assert result.exit_code == 0, result.output
    lines = dict(line.split(None, 1) for line in result.output.splitlines() if line.split())
    assert lines["family"].startswith(named), result.output
    assert ("through the hermes fallback" in lines["tools"]) == fallback, result.output
    parser = "Mistral's [TOOL_CALLS]" if family == "mistral" else "hermes" if family == "gemma3" else "response parser"
    assert parser in lines["replies"], result.output
    if note is not None:
        assert note in result.output, result.output


async def test_a_model_without_a_chat_template_is_refused_by_name_and_doctor_says_the_fix(
    server: tuple[str, Path], tmp_path: Path
) -> None:
    import openai
    from transformers import AutoTokenizer

    path = build_family_model(tmp_path / "bare", "llama3_2")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = None
    (path / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer.save_pretrained(path)
    result = doctor(path)
    assert result.exit_code == 0 and "no chat template: every chat request is refused" in result.output, result.output

    config = ModelConfig(engine="scripted", scripted_responses=["hi"], lora_rank=4)
    model = art.TrainableModel(name="bare", project="families", base_model=str(path), config=config)
    backend = RemoteBackend(server[0])
    await model.register(backend)
    client = model.openai_client()
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(model=model.name, messages=[{"role": "user", "content": "hi"}])
    assert re.search(r"has no chat template.*chat_template\.jinja", raised.value.response.text)
    await client.close()
    await backend.close()


async def test_chat_template_kwargs_reach_the_template(server: tuple[str, Path], tmp_path: Path) -> None:
    """vLLM's `chat_template_kwargs`: Qwen3's `enable_thinking=False` closes an empty think block in the prompt."""
    import openai
    from transformers import AutoTokenizer

    url, art_path = server
    path = build_family_model(tmp_path / "qwen3", "qwen3")
    config = ModelConfig(engine="scripted", scripted_responses=["Sunny."], lora_rank=4)
    model = art.TrainableModel(name="no-think", project="families", base_model=str(path), config=config)
    backend = RemoteBackend(url)
    await model.register(backend)
    client = model.openai_client()
    messages = [{"role": "user", "content": "Weather?"}]
    reply = await client.chat.completions.create(
        model=model.name, messages=messages, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    store = TokenStore(art_path / "families" / "models" / model.name / "tokens" / "store.sqlite")
    record = store.get(reply.id)
    assert record is not None
    prompt = AutoTokenizer.from_pretrained(path).decode(record.prompt_ids)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), prompt
    store.close()
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(
            model=model.name, messages=messages, extra_body={"chat_template_kwargs": 1}
        )
    await client.close()
    await backend.close()

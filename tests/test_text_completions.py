"""Legacy OpenAI Completions (`/v1/completions`) on the real server, through the real `openai` SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

import art_agents as art
from art_agents import ModelConfig, RemoteBackend, TrainableModel, TrainConfig, TrajectoryGroup

ANSWER = "The answer is 5."


async def registered(backend: RemoteBackend, tiny_model_path: Path, name: str, **config: Any) -> TrainableModel:
    model = TrainableModel(name=name, project="tests", base_model=str(tiny_model_path), config=ModelConfig(**config))
    await model.register(backend)
    return model


@pytest.fixture
async def client(server: str) -> AsyncIterator[openai.AsyncOpenAI]:
    """A plain SDK client: inside `art.rollout()` its calls are captured by the server."""
    async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
async def scripted(backend: RemoteBackend, tiny_model_path: Path) -> TrainableModel:
    return await registered(backend, tiny_model_path, "text-scripted", engine="scripted", scripted_responses=[ANSWER])


async def test_a_string_prompt_is_continued_untemplated_with_logprobs(client, scripted, tokenizer) -> None:
    reply = await client.completions.create(model=scripted.name, prompt="2 + 3 =", max_tokens=16, logprobs=1)
    choice = reply.choices[0]
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-") and reply.model == f"{scripted.name}@0"
    assert (choice.text, choice.finish_reason) == (ANSWER, "stop")
    assert reply.usage.prompt_tokens == len(tokenizer("2 + 3 =")["input_ids"])  # no chat template around it
    extra = choice.model_extra
    assert reply.model_extra["completion_id"] == reply.id == extra["completion_id"]
    assert extra["token_ids"] == [*tokenizer.encode(ANSWER, add_special_tokens=False), tokenizer.eos_token_id]
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == tokenizer.decode(extra["token_ids"])
    assert len(logprobs.token_logprobs) == len(extra["token_ids"]) and all(lp <= 0 for lp in logprobs.token_logprobs)
    assert logprobs.top_logprobs == [{t: lp} for t, lp in zip(logprobs.tokens, logprobs.token_logprobs, strict=True)]
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    plain = await client.completions.create(model=f"{scripted.name}@0", prompt="2 + 3 =", logprobs=0)
    assert plain.model == f"{scripted.name}@0" and plain.choices[0].logprobs.top_logprobs is None


async def test_a_token_id_prompt_is_the_string_prompt_it_encodes(client, backend, tiny_model_path, tokenizer) -> None:
    model = await registered(backend, tiny_model_path, "text-tiny")
    ids = tokenizer("Once upon a time")["input_ids"]
    greedy = {"model": model.name, "max_tokens": 6, "temperature": 0}
    replies = [await client.completions.create(prompt=prompt, **greedy) for prompt in ("Once upon a time", ids, [ids])]
    assert len({r.choices[0].text for r in replies}) == 1
    assert {r.usage.prompt_tokens for r in replies} == {len(ids)}
    assert all(r.choices[0].model_extra["token_ids"] for r in replies)


async def test_a_stream_sends_text_then_each_choice_with_its_tokens(client, scripted) -> None:
    stream = await client.completions.create(
        model=scripted.name, prompt="q", n=2, logprobs=1, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert {c.object for c in chunks} == {"text_completion"} and chunks[-1].choices == []
    finals = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in finals)
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert "".join(c.text for c in mine) == ANSWER
        last = mine[-1]
        assert last.finish_reason == "stop" and all(c.finish_reason is None for c in mine[:-1])
        assert len(last.logprobs.tokens) == len(last.model_extra["token_ids"])
    assert {c.model_extra["completion_id"] for c in finals} == {chunks[0].id, f"{chunks[0].id}-1"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("echo", True),
        ("suffix", " and so on"),
        ("best_of", 3),
        ("logprobs", 5),
        ("frequency_penalty", 0.5),
        ("prompt", ["one", "two"]),
        ("prompt", [10**9]),
        ("prompt", ""),
        ("max_tokens", 10**9),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_what_cannot_be_honoured_is_refused_by_name(client, scripted, field, value, stream) -> None:
    request = {"model": scripted.name, "prompt": "q", "stream": stream, field: value}
    with pytest.raises(openai.BadRequestError) as refused:
        await client.completions.create(**request)
    assert field in refused.value.body["message"]


async def test_an_unknown_model_or_step_is_refused_in_openai_shape(client, scripted) -> None:
    for model in ("nobody", f"{scripted.name}@7"):
        with pytest.raises(openai.NotFoundError, match=model.split("@")[0]):
            await client.completions.create(model=model, prompt="q")


async def test_completions_captured_inside_rollouts_train_a_step(client, backend, tiny_model_path) -> None:
    model = await registered(backend, tiny_model_path, "text-train", engine="scripted", scripted_responses=[ANSWER])
    trajectories = []
    own = model.openai_client()  # the toolkit's client records chat itself; its completions are captured by the server
    for reward, sdk, stream in ((1.0, client, False), (0.0, own, True)):
        async with art.rollout() as trajectory:
            reply = await sdk.completions.create(model=model.name, prompt="2 + 3 =", stream=stream)
            if stream:
                chunks = [chunk async for chunk in reply]
                completion_id = chunks[-1].choices[0].model_extra["completion_id"]
            else:
                completion_id = reply.completion_id
        trajectory.reward = reward
        trajectories.append(trajectory)
        assert [(m.role, m.content) for m in trajectory.messages] == [("user", "2 + 3 ="), ("assistant", ANSWER)]
        assert [(t.completion_id, t.model) for t in trajectory.turns] == [(completion_id, f"{model.name}@0")]

    await own.close()
    result = await model.train([TrajectoryGroup(trajectories)], TrainConfig(), progress=False)
    assert result.step == 1 and result.metrics["turns_retokenized"] == 0
    assert (await client.completions.create(model=model.name, prompt="2 + 3 =")).model == f"{model.name}@1"

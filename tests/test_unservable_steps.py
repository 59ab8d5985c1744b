"""A step whose weights cannot serve is never committed, and a non-finite metric never breaks the client.

An absurd learning rate gives a finite loss (measured before the update) and weights whose logits overflow: the
step is refused with a sentence naming the learning rate, and step N keeps serving. A NaN loss travels as null in
progress events, so the user sees the server's sentence rather than a pydantic dump.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import art_agents as art
from art_agents.errors import ArtError
from art_agents.local import LocalBackend
from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG
from art_agents.wire import TrainEvent, TrainSFTEvent


@pytest.fixture(scope="module")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(path=tmp_path_factory.mktemp("unservable") / ".art", in_process=True)
    yield backend
    await backend.close()


async def registered(backend: LocalBackend, name: str, tiny_model_path: Path) -> art.TrainableModel:
    model = art.TrainableModel(
        name=name, project="unservable", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG, report_to=[]
    )
    await model.register(backend)
    return model


def demonstration() -> art.Trajectory:
    return art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "What is the capital of Zorbia?"},
            {"role": "assistant", "content": "Zorbia's capital is Quuxtown."},
        ]
    )


async def served_name(model: art.TrainableModel) -> str:
    """Who answers a greedy completion now (a 500 here is what a committed unservable step caused)."""
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=3
    )
    return completion.model


def history_steps(backend: LocalBackend, name: str) -> list[int]:
    path = backend.path / "unservable" / "models" / name / "history.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


async def test_sft_step_with_overflowing_weights_is_refused_and_step_n_serves(
    backend: LocalBackend, tiny_model_path: Path
) -> None:
    model = await registered(backend, "overflow-sft", tiny_model_path)
    assert (await model.train_sft([demonstration()], art.TrainSFTConfig(learning_rate=1e-3), progress=False)).step == 1
    with pytest.raises(ArtError, match=r"learning_rate=1e\+30.*lower the learning rate.*step 1 keeps serving"):
        await model.train_sft([demonstration()], art.TrainSFTConfig(learning_rate=1e30), progress=False)
    assert await model.get_step() == 1 and await served_name(model) == "overflow-sft@1"
    assert history_steps(backend, "overflow-sft") == [1]
    assert not (backend.path / "unservable" / "models" / "overflow-sft" / "checkpoints" / "0002").exists()
    # the policy was put back too: the next sane call trains from step 1's weights and serves
    assert (await model.train_sft([demonstration()], art.TrainSFTConfig(learning_rate=1e-3), progress=False)).step == 2
    assert await served_name(model) == "overflow-sft@2"


async def test_rl_step_with_overflowing_weights_is_refused_and_step_n_serves(
    backend: LocalBackend, tiny_model_path: Path
) -> None:
    model = await registered(backend, "overflow-rl", tiny_model_path)
    client = model.openai_client()

    async def rollout(reward: float) -> art.Trajectory:
        trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "Say hi."}], reward=reward)
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=6
        )
        trajectory.messages_and_choices.append(completion.choices[0])
        return trajectory

    group = art.TrajectoryGroup([await rollout(0.0), await rollout(1.0)])
    with pytest.raises(ArtError, match=r"learning_rate=1e\+30.*lower the learning rate.*step 0 keeps serving"):
        await model.train([group], art.TrainConfig(learning_rate=1e30), progress=False)
    assert await model.get_step() == 0 and await served_name(model) == "overflow-rl@0"
    assert history_steps(backend, "overflow-rl") == []


async def test_a_nan_loss_reaches_the_user_as_the_servers_sentence(
    backend: LocalBackend, tiny_model_path: Path
) -> None:
    model = await registered(backend, "nan-sft", tiny_model_path)
    config = art.TrainSFTConfig(learning_rate=1e30, epochs=3, batch_size=1)
    with pytest.raises(ArtError) as failed:
        await model.train_sft([demonstration()], config, progress=False)
    message = str(failed.value)
    assert "lower the learning rate" in message and "ValidationError" not in message and "pydantic" not in message
    assert await model.get_step() == 0 and await served_name(model) == "nan-sft@0"


@pytest.mark.parametrize("event", [TrainEvent, TrainSFTEvent])
def test_non_finite_metrics_travel_as_null_and_come_back_as_nan(event: type[TrainEvent]) -> None:
    sent = event(type="progress", done=1, total=3, metrics={"loss": math.nan, "grad_norm": math.inf, "lr": 1e-3})
    line = sent.model_dump_json()
    json.loads(line)  # strict JSON: no NaN or Infinity literals
    received = event.model_validate_json(line)
    assert math.isnan(received.metrics["loss"]) and math.isnan(received.metrics["grad_norm"])
    assert received.metrics["lr"] == 1e-3

"""Training owns its policy: the engine serves on while a step trains, over the same base weights (held once),
and serves `name@N+1` once the step is published."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from server_fixtures import start_server

from art_agents.backends.remote import RemoteBackend
from art_agents.model import TrainableModel
from art_agents.server.engines.transformers_engine import TransformersEngine
from art_agents.server.ops.quickstart import TOY_CONFIG, TOY_MODEL_CONFIG, rollout_groups
from art_agents.server.training.policy_model import PolicyModel


def test_the_policy_holds_the_engines_base_weights_and_a_lora_of_its_own(tiny_model_path: Path) -> None:
    import torch

    engine = TransformersEngine.load(str(tiny_model_path), TOY_MODEL_CONFIG)
    policy = PolicyModel.load(str(tiny_model_path), TOY_MODEL_CONFIG, engine.tokenizer, engine.base_weights())
    served = dict(engine.model.named_parameters())
    trained = dict(policy.model.named_parameters())
    assert served.keys() == trained.keys()
    base = [name for name in served if "lora_" not in name]
    lora = [name for name in served if "lora_" in name]
    assert base and lora
    assert all(trained[name].data_ptr() == served[name].data_ptr() for name in base)  # one copy in memory
    assert all(trained[name].data_ptr() != served[name].data_ptr() for name in lora)
    assert all(torch.equal(trained[name], served[name]) for name in lora)  # the same step to start from
    name = next(name for name in lora if "lora_B" in name)
    with torch.no_grad():
        trained[name].add_(1.0)  # training the policy leaves the served adapter as it was
    assert not torch.equal(trained[name], served[name]) and served[name].abs().sum() == 0
    assert not any(p.requires_grad for name, p in trained.items() if name in base)


@pytest.fixture
def step_held_midway(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold a training step after its first update until released: (reached, release)."""
    from art_agents.server.training.trainer import PolicyTrainer

    reached, release = threading.Event(), threading.Event()
    train = PolicyTrainer.train

    def held(self: PolicyTrainer, groups: Any, config: Any, progress: Any = None, **kwargs: Any) -> Any:
        def report(done: int, total: int, metrics: dict[str, float]) -> None:
            reached.set()
            assert release.wait(120), "the test never released the step"
            if progress is not None:
                progress(done, total, metrics)

        return train(self, groups, config, report, **kwargs)

    monkeypatch.setattr(PolicyTrainer, "train", held)
    return reached, release


async def test_serving_answers_the_previous_step_while_a_step_trains_then_the_new_one(
    tiny_model_path: Path, tmp_path: Path, step_held_midway: tuple[threading.Event, threading.Event]
) -> None:
    reached, release = step_held_midway
    with start_server(tmp_path / "art") as url:
        backend = RemoteBackend(url)
        model = TrainableModel(name="m", project="p", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG)
        await model.register(backend)
        client = model.openai_client()
        question = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6}
        greedy = {**question, "temperature": 0, "logprobs": True}
        before = await client.chat.completions.create(**greedy)
        training = asyncio.create_task(
            model.train(await rollout_groups(client, model, step=0), TOY_CONFIG, progress=False)
        )
        try:
            assert await asyncio.to_thread(reached.wait, 120)  # the policy has taken its first update
            during = await client.chat.completions.create(**greedy)
            assert not training.done()
            assert during.model == "m@0" and during.choices[0].message.content == before.choices[0].message.content
            served = [t.logprob for t in during.choices[0].logprobs.content]
            assert served == pytest.approx([t.logprob for t in before.choices[0].logprobs.content], abs=1e-5)
        finally:
            release.set()
        result = await training
        after = await client.chat.completions.create(**greedy)
        assert result.step == 1 and after.model == "m@1"
        changed = [t.logprob for t in after.choices[0].logprobs.content]
        assert changed != pytest.approx(served, abs=1e-4)  # the trained weights are served now
        await client.close()
        await backend.close()

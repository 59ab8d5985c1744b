"""End to end on CPU: serve the tiny model, roll out through the OpenAI SDK, train; and survive kill -9."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from server_fixtures import start_server

from art_agents.backends.local import LocalBackend
from art_agents.backends.remote import RemoteBackend
from art_agents.errors import ArtError
from art_agents.model import TrainableModel
from art_agents.server.ops.quickstart import TOY_CONFIG, TOY_MODEL_CONFIG, rollout_groups, train_toy_task
from art_agents.server.storage.token_store import TokenStore
from art_agents.train_config import TrainConfig


def store_of(art_path: Path, model: TrainableModel) -> TokenStore:
    return TokenStore(art_path / model.project / "models" / model.name / "tokens" / "store.sqlite")


async def test_toy_reward_doubles_and_trains_the_sampled_tokens(tiny_model_path: Path, tmp_path: Path) -> None:
    art_path = tmp_path / "art"
    with start_server(art_path) as url:
        backend = RemoteBackend(url)
        model = TrainableModel(name="toy", project="e2e", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG)
        await model.register(backend)

        # one step by hand: the tokens trained are the tokens the store holds for these completions
        client = model.openai_client()
        groups = await rollout_groups(client, model, step=0)
        await client.close()
        store = store_of(art_path, model)
        records = store.get_many(t.completion_id for g in groups for tr in g.trajectories for t in tr.turns)
        assert len(records) == 24 and all(r.policy_step == 0 for r in records.values())
        result = await model.train(groups, TOY_CONFIG, progress=False)
        metrics = result.metrics
        assert result.step == 1 and await model.get_step() == 1
        assert metrics["turns_from_store"] == 24 and metrics["turns_retokenized"] == 0 and metrics["sequences"] == 24
        assert metrics["tokens_trained"] == sum(len(r.completion_ids) for r in records.values())
        assert metrics["logprob_gap_sampler"] < 1e-3  # same tokens at the same positions as sampled

        # then the toy task: the reward at the last step is at least twice that of step 0
        rounds = await train_toy_task(model, steps=9, echo=False)
        assert [r.step for r in rounds] == list(range(1, 10)) and rounds[-1].trained_step is None
        assert rounds[-1].reward >= 2 * rounds[0].reward, rounds
        history = [
            json.loads(line)
            for line in (art_path / "e2e" / "models" / "toy" / "history.jsonl").read_text().splitlines()
        ]
        assert [row["step"] for row in history] == list(range(1, len(history) + 1))
        assert history[0]["config"] == TOY_CONFIG.model_dump(mode="json")  # every step logs its full config
        await backend.close()


async def test_kill_9_during_training_then_restart_and_retry(tiny_model_path: Path, tmp_path: Path) -> None:
    art_path = tmp_path / "art"
    model = TrainableModel(name="sturdy", project="e2e", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG)
    backend = LocalBackend(art_path)
    try:
        await model.register(backend)
        client = model.openai_client()
        await model.train(await rollout_groups(client, model, step=0, rollouts=4), TOY_CONFIG, progress=False)
        assert await model.get_step() == 1
        groups = await rollout_groups(client, model, step=1, rollouts=4)
        await client.close()
        rows_before = store_of(art_path, model).count()

        slow = TrainConfig(
            learning_rate=1e-3, micro_batch_size=1, num_iterations=200
        )  # long enough to be killed mid-step
        with pytest.raises(ArtError, match="retried"):
            async for event in backend.train_events(model, groups, slow):
                if event.type == "progress":
                    os.kill(backend._process.pid, signal.SIGKILL)
        backend._process.wait(timeout=10)
    finally:
        await backend.close()

    # restart on the same folder (in-process this time: only the killed server needed to be a child process)
    with start_server(art_path) as url:
        restarted = RemoteBackend(url)
        await model.register(restarted)
        assert await model.get_step() == 1  # the last good step, not the interrupted one
        client = model.openai_client()
        reply = await client.chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert reply.model == "sturdy@1"
        assert store_of(art_path, model).count() == rows_before + 1  # no row lost (+ the reply just made)
        result = await model.train(groups, TOY_CONFIG, progress=False)  # the interrupted call, retried
        assert result.step == 2 and await model.get_step() == 2
        reply = await client.chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert reply.model == "sturdy@2"
        await client.close()
        model_dir = art_path / "e2e" / "models" / "sturdy"
        assert sorted(p.name for p in (model_dir / "checkpoints").iterdir() if not p.name.startswith(".")) == [
            "0000",
            "0001",
            "0002",
        ]
        assert [json.loads(line)["step"] for line in (model_dir / "history.jsonl").read_text().splitlines()] == [1, 2]
        await restarted.close()

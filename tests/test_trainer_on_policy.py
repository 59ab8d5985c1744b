"""Real rollouts from the tiny model through the server: the trainer trains the policy that sampled.

Sampling temperature and top-p, stale samples, turns answered by another model, trajectories whose
turns merged or did not, several iterations per step, and dropout.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from scripted_openai import ScriptedOpenAI
from server_fixtures import start_server
from test_training_trainer import lora_model, sampled

from art_agents import Trajectory, TrajectoryGroup
from art_agents.backends.remote import RemoteBackend
from art_agents.capture import rollout
from art_agents.errors import ArtError
from art_agents.model import Model, TrainableModel
from art_agents.server.storage.token_store import TokenStore
from art_agents.server.training.sequences import build_sequences
from art_agents.server.training.trainer import PolicyTrainer
from art_agents.train_config import TrainConfig


async def conversation(model: Model, turns: int, first: str, **sampling: Any) -> Trajectory:
    """One rollout of `turns` calls, each appending the reply and a user "go on" (the history grows)."""
    client = model.openai_client()
    async with rollout() as trajectory:
        messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
        for _ in range(turns):
            response = await client.chat.completions.create(model=model.served_name, messages=messages, **sampling)  # type: ignore[arg-type]
            messages += [
                response.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "go on"},
            ]
    await client.close()
    return trajectory


def store_of(art_path: Path, model: TrainableModel) -> TokenStore:
    return TokenStore(art_path / model.project / "models" / model.name / "tokens" / "store.sqlite")


async def test_sampled_at_t07_top_p_09_the_sampler_and_trainer_agree_and_stale_turns_are_named(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    art_path = tmp_path / "art"
    with start_server(art_path) as url:
        backend = RemoteBackend(url)
        model = TrainableModel(name="tempered", project="p", base_model=str(tiny_model_path))
        await model.register(backend)
        sampling = {"temperature": 0.7, "top_p": 0.9, "max_tokens": 8}
        groups = [
            TrajectoryGroup([await conversation(model, 1, f"question {g}", **sampling) for _ in range(4)])
            for g in range(2)
        ]
        for g, group in enumerate(groups):
            for t, trajectory in enumerate(group.trajectories):
                trajectory.reward = float((g + t) % 3)

        # the stored logprobs are the tempered policy's (the adapter starts as the identity)
        turn = groups[0].trajectories[0].turns[0]
        record = store_of(art_path, model).get(turn.completion_id or "")
        assert record is not None and (record.temperature, record.top_p) == (0.7, 0.9)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        ids = torch.tensor([record.prompt_ids + record.completion_ids])
        with torch.no_grad():
            logits = base(input_ids=ids).logits[0, len(record.prompt_ids) - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(record.completion_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(record.logprobs), expected, atol=1e-4)

        fresh = await model.train(groups, TrainConfig(learning_rate=5e-3), progress=False)
        assert fresh.step == 1 and fresh.metrics["logprob_gap_sampler"] < 1e-4
        assert fresh.metrics["turns_staleness_0"] == 8

        with pytest.raises(ArtError, match=r"max_staleness=0 .* current step 1: 'chatcmpl-.*' \(sampled at step 0\)"):
            await model.train(groups, TrainConfig(), progress=False)
        stale = await model.train(groups, TrainConfig(max_staleness=1, learning_rate=5e-3), progress=False)
        assert stale.step == 2 and stale.metrics["turns_staleness_1"] == 8
        assert stale.metrics["logprob_gap_sampler"] > 100 * fresh.metrics["logprob_gap_sampler"] + 1e-4
        await backend.close()


async def test_turns_of_another_model_stay_context_and_are_counted(tiny_model_path: Path, tmp_path: Path) -> None:
    with ScriptedOpenAI(["a judge's remark"] * 8) as other, start_server(tmp_path / "art") as url:
        backend = RemoteBackend(url)
        model = TrainableModel(name="policy", project="p", base_model=str(tiny_model_path))
        await model.register(backend)
        helper = Model(name="judge", inference_base_url=other.base_url, inference_api_key="k")
        group = []
        for k in range(2):
            trajectory = await conversation(model, 1, f"task {k}", max_tokens=6)
            async with rollout(trajectory):  # the same rollout asks another model too
                client = helper.openai_client()
                await client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "rate"}])
                await client.close()
            trajectory.reward = float(k)
            group.append(trajectory)
        assert [len(t.turns) for t in group] == [2, 2] and group[0].turns[1].model == "judge@0"
        result = await model.train([TrajectoryGroup(group)], progress=False)
        assert result.step == 1 and result.metrics["turns_foreign"] == 2 and result.metrics["turns_from_store"] == 2

        for trajectory in group:
            trajectory.turns = trajectory.turns[1:]  # only the other model's turns are left
        with pytest.raises(ArtError, match=r"answered by another model .* none by 'policy'"):
            await model.train([TrajectoryGroup(group)], progress=False)
        await backend.close()


async def test_merged_and_unmerged_real_rollouts_weigh_the_same(tiny_model_path: Path, tmp_path: Path) -> None:
    """3-turn rollouts of the tiny model: greedy ones re-render to the sampled tokens and merge into one
    sequence; sampled ones (seeded) mostly do not round-trip through the template and become three. At ratio 1 the zero-mean advantages of a group of one
    of each give a loss of 0 only if each trajectory weighs the same however it was split."""
    from transformers import AutoTokenizer

    art_path = tmp_path / "art"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    with start_server(art_path) as url:
        backend = RemoteBackend(url)
        model = TrainableModel(name="turns", project="p", base_model=str(tiny_model_path))
        await model.register(backend)
        store = store_of(art_path, model)
        found: dict[int, Trajectory] = {}
        for k in range(40):
            sampling = {"temperature": 0, "max_tokens": 3} if 1 not in found else {"seed": k, "max_tokens": 6}
            trajectory = await conversation(model, 3, f"hello {k}", **sampling)
            count = len(build_sequences([TrajectoryGroup([trajectory])], store, tokenizer)[0])
            found.setdefault(count, trajectory)
            if 1 in found and 3 in found:
                break
        assert 1 in found and 3 in found, f"sequence counts seen: {sorted(found)}"
        merged, split = found[1], found[3]
        merged.reward, split.reward = 1.0, 0.0
        sequences, _ = build_sequences(
            [TrajectoryGroup([merged, split])], store, tokenizer, {(0, 0): 1.0, (0, 1): -1.0}
        )
        assert [s.trajectory for s in sequences] == [0, 1, 1, 1]
        assert {s.trajectory_tokens for s in sequences[1:]} == {sum(s.trained_tokens for s in sequences[1:])}
        result = await model.train([TrajectoryGroup([merged, split])], progress=False)
        assert result.metrics["sequences"] == 4 and abs(result.metrics["loss"]) < 1e-6
        await backend.close()


def trainer_and_groups(tiny_model_path: Path, tokenizer: Any, store: TokenStore, dropout: float) -> tuple[Any, list]:
    model = lora_model(tiny_model_path, dropout=dropout)
    with torch.no_grad():  # B starts at 0, which would hide what dropout does to the adapter's output
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    groups = [
        TrajectoryGroup(
            sampled(model, tokenizer, store, f"prompt {g}", f"answer {t} to {g}", float(t)) for t in range(3)
        )
        for g in range(2)
    ]
    return PolicyTrainer(model, tokenizer, store), groups


def test_clip_fraction_counts_every_iteration(tiny_model_path: Path, tokenizer: Any, store: TokenStore) -> None:
    trainer, groups = trainer_and_groups(tiny_model_path, tokenizer, store, dropout=0.0)
    metrics = trainer.train(groups, TrainConfig(num_iterations=4, learning_rate=3e-2, epsilon=0.05))
    assert metrics["optimizer_steps"] == 4 and 0 < metrics["clip_fraction"] < 1


def test_dropout_is_off_so_the_first_iteration_ratio_is_one(
    tiny_model_path: Path, tokenizer: Any, store: TokenStore
) -> None:
    trainer, groups = trainer_and_groups(tiny_model_path, tokenizer, store, dropout=0.5)
    metrics = trainer.train(groups, TrainConfig(num_iterations=2, learning_rate=1e-9, epsilon=1e-3))
    assert metrics["clip_fraction"] == 0.0  # with LoRA dropout on while training, most ratios leave 1 +- 1e-3
    assert not math.isnan(metrics["loss"])


def test_a_store_written_before_temperatures_were_kept_reads_as_temperature_one(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "store.sqlite"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE tokens (completion_id TEXT PRIMARY KEY, model TEXT NOT NULL, policy_step INTEGER NOT NULL, "
        "prompt_ids TEXT NOT NULL, completion_ids TEXT NOT NULL, logprobs TEXT NOT NULL, created_at REAL NOT NULL)"
    )
    old.execute("INSERT INTO tokens VALUES ('c1', 'm', 3, '[1]', '[2]', '[-0.5]', 0.0)")
    old.commit()
    old.close()
    record = TokenStore(path).get("c1")
    assert record is not None and (record.temperature, record.top_p, record.policy_step) == (1.0, 1.0, 3)

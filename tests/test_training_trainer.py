"""PolicyTrainer on a real PEFT LoRA of the tiny model, and atomic checkpoints."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from art_agents.capture import record_completion
from art_agents.server.models.chat_format import render_prompt_ids
from art_agents.server.storage.checkpoints import (
    append_history,
    checkpoint_path,
    delete_checkpoints,
    latest_step,
    list_checkpoints,
    load_optimizer_state,
    save_checkpoint,
)
from art_agents.server.storage.token_store import TokenRecord, TokenStore
from art_agents.server.training.sequences import TrainingInputError
from art_agents.server.training.trainer import PolicyTrainer
from art_agents.train_config import TrainConfig
from art_agents.trajectory import Trajectory, TrajectoryGroup

REQUIRED_METRICS = {
    "loss", "reward_mean", "reward_std", "groups_total", "groups_skipped_zero_variance", "sequences", "tokens_trained",
    "turns_from_store", "turns_retokenized", "grad_norm", "train_s", "logprob_gap_sampler",
}  # fmt: skip


def lora_model(path: Path, dropout: float = 0.0) -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights="gaussian",
        lora_dropout=dropout,
    )
    return get_peft_model(base, config)


def sampled(model: Any, tokenizer: Any, store: TokenStore, prompt: str, text: str, reward: float) -> Trajectory:
    """A one-turn rollout whose stored logprobs are the model's own (as an exact sampler would report)."""
    request = [{"role": "user", "content": prompt}]
    prompt_ids = render_prompt_ids(tokenizer, request, None)
    completion = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + completion])).logits[0].log_softmax(-1)
    logprobs = [float(logits[len(prompt_ids) - 1 + i, token]) for i, token in enumerate(completion)]
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    store.add(
        TokenRecord(
            completion_id=cid,
            model="m",
            policy_step=0,
            prompt_ids=prompt_ids,
            completion_ids=completion,
            logprobs=logprobs,
        )
    )
    trajectory = Trajectory(reward=reward)
    record_completion(request, {"role": "assistant", "content": text}, completion_id=cid, trajectory=trajectory)
    return trajectory


def groups_for(model: Any, tokenizer: Any, store: TokenStore) -> list[TrajectoryGroup]:
    texts = ["aaaa", "bb", "a b a", "hello world", "42"]
    return [
        TrajectoryGroup(
            [
                sampled(model, tokenizer, store, f"task {g}", text, reward=text.count("a") + g)
                for text in texts[g:] + texts[:g]
            ]
        )
        for g in range(2)
    ]


def lora_weights(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_train_step_updates_lora_and_reports_metrics(tiny_model_path: Path, tokenizer: Any, store: TokenStore) -> None:
    model = lora_model(tiny_model_path)
    groups = groups_for(model, tokenizer, store)
    before = lora_weights(model)
    progress: list[tuple[int, int]] = []
    metrics = PolicyTrainer(model, tokenizer, store).train(
        groups,
        TrainConfig(learning_rate=1e-3, micro_batch_size=3),
        lambda done, total, _: progress.append((done, total)),
    )
    assert metrics.keys() >= REQUIRED_METRICS
    assert metrics["sequences"] == 10 and metrics["turns_from_store"] == 10 and metrics["skipped"] == 0
    assert metrics["tokens_trained"] == sum(
        len(store.get(t.completion_id).completion_ids) for g in groups for tr in g.trajectories for t in tr.turns
    )
    # the stored logprobs are the model's own: the trainer scores exactly the sampled tokens at the same positions
    assert metrics["logprob_gap_sampler"] < 1e-4
    assert progress[-1] == (10, 10) and len(progress) == 4
    after = lora_weights(model)
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_micro_batching_and_gradient_checkpointing_do_not_change_the_update(
    tiny_model_path: Path, tokenizer: Any, store: TokenStore
) -> None:
    results = []
    groups = groups_for(lora_model(tiny_model_path), tokenizer, store)
    memory_knobs: list[dict[str, Any]] = [
        {"micro_batch_size": 1},
        {"micro_batch_size": 10},
        {"micro_batch_size": 10, "micro_batch_tokens": 40},  # a few sequences per micro-batch, by length
        {"micro_batch_size": 10, "gradient_checkpointing": True},
    ]
    for knobs in memory_knobs:
        model = lora_model(tiny_model_path)  # the same seeded LoRA each time
        # grpo's per-sequence means are the normalisation most easily broken by micro-batching
        config = TrainConfig(learning_rate=1e-3, beta=0.05, num_iterations=2, **knobs)
        PolicyTrainer(model, tokenizer, store).train(groups, config)
        assert not model.base_model.model.is_gradient_checkpointing  # off again for serving
        results.append(lora_weights(model))
    for result in results[1:]:
        for name, value in results[0].items():
            assert torch.allclose(value, result[name], atol=1e-6), name


def test_micro_batches_are_capped_by_padded_tokens() -> None:
    from art_agents.server.training.batches import chunks

    sequences = [SimpleNamespace(token_ids=[0] * n) for n in (30, 10, 12, 25, 8)]
    micro = chunks(sequences, size=4, tokens=50)  # type: ignore[arg-type]
    assert [[len(s.token_ids) for s in chunk] for chunk in micro] == [[30], [25, 12], [10, 8]]
    assert [len(c) for c in chunks(sequences, size=2)] == [2, 2, 1]  # type: ignore[arg-type]


def test_all_zero_variance_groups_take_no_step(tiny_model_path: Path, tokenizer: Any, store: TokenStore) -> None:
    model = lora_model(tiny_model_path)
    flat = [TrajectoryGroup([sampled(model, tokenizer, store, "t", text, reward=1.0) for text in ("a", "b")])]
    before = lora_weights(model)
    metrics = PolicyTrainer(model, tokenizer, store).train(flat, TrainConfig())
    assert metrics["skipped"] == 1 and metrics["optimizer_steps"] == 0 and metrics["groups_skipped_zero_variance"] == 1
    assert all(torch.equal(before[n], p) for n, p in lora_weights(model).items())


def test_failure_mid_step_restores_the_weights(tiny_model_path: Path, tokenizer: Any, store: TokenStore) -> None:
    model = lora_model(tiny_model_path)
    groups = groups_for(model, tokenizer, store)
    before = lora_weights(model)

    def explode(done: int, total: int, metrics: dict[str, float]) -> None:
        if done > total // 2:
            raise RuntimeError("boom")

    trainer = PolicyTrainer(model, tokenizer, store)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train(groups, TrainConfig(num_iterations=2, micro_batch_size=2, learning_rate=1e-2), explode)
    assert all(torch.equal(before[n], p) for n, p in lora_weights(model).items())
    assert trainer.train(groups, TrainConfig())["skipped"] == 0  # and the trainer still works


def test_bad_groups_are_training_input_errors(tiny_model_path: Path, tokenizer: Any, store: TokenStore) -> None:
    trainer = PolicyTrainer(lora_model(tiny_model_path), tokenizer, store)
    with pytest.raises(TrainingInputError, match="no trajectory groups"):
        trainer.train([], TrainConfig())
    with pytest.raises(TrainingInputError, match="no model turns"):
        trainer.train([TrajectoryGroup([Trajectory(reward=1.0), Trajectory(reward=0.0)])], TrainConfig())


def test_checkpoints_are_atomic_and_keep_the_optimizer(
    tiny_model_path: Path, tokenizer: Any, store: TokenStore, tmp_path: Path
) -> None:
    model = lora_model(tiny_model_path)
    model_dir = tmp_path / "models" / "m"
    save_checkpoint(model_dir, 0, model, None, {"note": "fresh"})
    trainer = PolicyTrainer(model, tokenizer, store)
    trainer.train(groups_for(model, tokenizer, store), TrainConfig(learning_rate=1e-3))
    save_checkpoint(model_dir, 1, model, trainer.optimizer_state(), {"metrics": {"loss": 0.1}})
    (model_dir / "checkpoints" / ".tmp-2-999999").mkdir()  # a save that died half-way
    assert latest_step(model_dir) == 1
    assert [c.step for c in list_checkpoints(model_dir)] == [0, 1]
    assert (checkpoint_path(model_dir, 1) / "adapter_model.safetensors").exists()
    assert load_optimizer_state(model_dir, 0) is None
    state = load_optimizer_state(model_dir, 1)
    resumed = PolicyTrainer(model, tokenizer, store, optimizer_state=state)
    assert resumed.optimizer_state()["state"].keys() == trainer.optimizer_state()["state"].keys()
    save_checkpoint(model_dir, 2, model, trainer.optimizer_state(), {})
    assert not (model_dir / "checkpoints" / ".tmp-2-999999").exists()  # stale temp of a dead process cleaned
    assert delete_checkpoints(model_dir, [1, 2]) == [1]  # the latest is never deleted
    assert delete_checkpoints(model_dir) == [] and latest_step(model_dir) == 2
    append_history(model_dir, {"step": 1})
    append_history(model_dir, {"step": 2})
    assert (model_dir / "history.jsonl").read_text().splitlines() == ['{"step": 1}', '{"step": 2}']

"""Self-distillation with hints: the loss term against a direct computation, the teacher's scores on the real tiny
model, hint-less trajectories training as before, and the KL to a kept checkpoint (`reference_step`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_training_trainer import lora_model, sampled

from art_agents.server.storage.token_store import TokenStore
from art_agents.server.training.loss import BatchTotals, policy_loss
from art_agents.server.training.self_distill import hint_ids, reply_header
from art_agents.server.training.trainer import PolicyTrainer
from art_agents.train_config import TrainConfig
from art_agents.trajectory import TrajectoryGroup


@pytest.mark.parametrize("loss", ["grpo", "dapo"])
@pytest.mark.parametrize("on_policy", [True, False])
def test_the_distillation_term_and_its_gradient_equal_a_direct_computation(loss: str, on_policy: bool) -> None:
    torch.manual_seed(0)
    logps = (-torch.rand(3, 6, dtype=torch.float64) * 3).requires_grad_()
    old = logps.detach() if on_policy else logps.detach() + 0.05 * torch.randn(3, 6, dtype=torch.float64)
    teacher = -torch.rand(3, 6, dtype=torch.float64) * 3
    teacher[1] = float("nan")  # a trajectory without a hint
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    advantages = torch.tensor([0.5, -1.0, 0.25], dtype=torch.float64)
    config = TrainConfig(loss=loss, self_distill=0.7, epsilon=10.0)  # no clipping: the plain ratio objective
    got, sums = policy_loss(logps, old, advantages, mask, config, BatchTotals(trajectories=3, tokens=13), None,
                            teacher_logps=teacher)  # fmt: skip
    got.backward()

    direct = logps.detach().clone().requires_grad_()
    ratio = torch.exp(direct - old)
    gap = torch.where(torch.isfinite(teacher), direct.detach() - teacher.nan_to_num(), 0.0)
    per_token = (-advantages[:, None] * ratio + 0.7 * gap * ratio) * mask
    expected = (per_token.sum(1) / mask.sum(1)).sum() / 3 if loss == "grpo" else per_token.sum() / 13
    expected.backward()
    assert abs(float(got.detach()) - float(expected.detach())) < 1e-5
    assert torch.allclose(logps.grad, direct.grad, atol=1e-5)
    # the gradient of the term is the per-token reverse-KL gradient: (logp - logp_teacher) * ratio
    assert sums["hinted_tokens"] == 7 and abs(sums["distill_gap_sum"] - float((gap * mask).sum())) < 1e-9


def _groups(model: Any, tokenizer: Any, store: TokenStore, *, hints: bool, rewards: list[float]) -> list[Any]:
    texts = ["aaaa", "bb", "a b a", "42"]
    group = [
        sampled(model, tokenizer, store, "add 2 and 3", text, reward)
        for text, reward in zip(texts, rewards, strict=False)
    ]
    if hints:
        for trajectory in group:
            trajectory.hint = "the answer is 5"
    return [TrajectoryGroup(group)]


def _lora(path: Path) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in path.named_parameters() if p.requires_grad}  # type: ignore[attr-defined]


def test_the_teacher_scores_the_students_tokens_with_the_hint_in_front(
    tiny_model_path: Path, tokenizer: Any, store: TokenStore
) -> None:
    model = lora_model(tiny_model_path)
    groups = _groups(model, tokenizer, store, hints=True, rewards=[1, 0, 0, 1])
    hint = hint_ids(tokenizer, "the answer is 5")
    header = reply_header(tokenizer)
    assert tokenizer.decode(header) == "<|im_start|>assistant\n"
    expected = []
    with torch.no_grad():
        for trajectory in groups[0].trajectories:
            record = store.get(trajectory.turns[0].completion_id or "")
            assert record is not None
            prompt, completion = record.prompt_ids, record.completion_ids
            plain = model(input_ids=torch.tensor([prompt + completion])).logits[0].log_softmax(-1)
            assert prompt[-len(header) :] == header  # the hint goes in just before the reply opens
            at = len(prompt) - len(header)
            teacher_ids = prompt[:at] + hint + prompt[at:] + completion
            hinted = model(input_ids=torch.tensor([teacher_ids])).logits[0].log_softmax(-1)
            for i, token in enumerate(completion):
                expected.append(
                    float(plain[len(prompt) - 1 + i, token] - hinted[len(hint) + len(prompt) - 1 + i, token])
                )
    assert tokenizer.decode(hint).startswith("<|im_start|>system\nPrivileged hint")

    metrics = PolicyTrainer(model, tokenizer, store).train(groups, TrainConfig(self_distill=1.0))
    assert metrics["trajectories_hinted"] == 4 and metrics["hinted_fraction"] == 1.0
    assert abs(metrics["self_distill_kl"] - sum(expected) / len(expected)) < 1e-5


def test_without_hints_self_distillation_trains_exactly_as_before(
    tiny_model_path: Path, tokenizer: Any, store: TokenStore
) -> None:
    trained = []
    for config in (TrainConfig(learning_rate=1e-2), TrainConfig(learning_rate=1e-2, self_distill=1.0)):
        model = lora_model(tiny_model_path)
        groups = _groups(model, tokenizer, store, hints=False, rewards=[1, 0, 0, 1])
        metrics = PolicyTrainer(model, tokenizer, store).train(groups, config)
        trained.append((metrics["loss"], _lora(model)))
    (loss_a, weights_a), (loss_b, weights_b) = trained
    assert loss_a == loss_b and all(torch.equal(weights_a[n], weights_b[n]) for n in weights_a)


def test_a_group_of_equal_rewards_trains_on_its_hints_alone(
    tiny_model_path: Path, tokenizer: Any, store: TokenStore
) -> None:
    model = lora_model(tiny_model_path)
    before = _lora(model)
    plain = PolicyTrainer(model, tokenizer, store).train(
        _groups(model, tokenizer, store, hints=False, rewards=[0, 0, 0, 0]), TrainConfig(self_distill=1.0)
    )
    assert plain["skipped"] == 1 and plain["groups_skipped_zero_variance"] == 1

    groups = _groups(model, tokenizer, store, hints=True, rewards=[0, 0, 0, 0])
    groups[0].trajectories[1].hint = None
    hinted = PolicyTrainer(model, tokenizer, store).train(groups, TrainConfig(self_distill=1.0, learning_rate=1e-2))
    assert hinted["skipped"] == 0 and hinted["groups_skipped_zero_variance"] == 1
    assert hinted["sequences"] == 3 and hinted["trajectories_hinted"] == 3  # the hint-less one has nothing to learn
    assert any(not torch.equal(before[n], p) for n, p in _lora(model).items())


def test_self_distill_only_trains_the_hinted_trajectories_with_no_advantage(
    tiny_model_path: Path, tokenizer: Any, store: TokenStore
) -> None:
    model = lora_model(tiny_model_path)
    groups = _groups(model, tokenizer, store, hints=False, rewards=[1, 0, 0, 1])
    groups[0].trajectories[2].hint = "the answer is 5"
    metrics = PolicyTrainer(model, tokenizer, store).train(
        groups, TrainConfig(self_distill=1.0, self_distill_only=True)
    )
    assert metrics["sequences"] == 1 and metrics["hinted_fraction"] == 1.0
    # advantage 0 on-policy: the loss is the distillation term, the mean gap of the hinted tokens
    assert abs(metrics["loss"] - metrics["self_distill_kl"]) < 1e-5
    with pytest.raises(ValueError, match=r"self_distill_only .* self_distill=1\.0"):
        TrainConfig(self_distill_only=True)


def test_the_kl_is_taken_to_a_kept_checkpoint_and_the_policy_is_put_back(
    tiny_model_path: Path, tokenizer: Any, store: TokenStore, tmp_path: Path
) -> None:
    model = lora_model(tiny_model_path)
    torch.manual_seed(1)
    with torch.no_grad():
        for _name, param in model.named_parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn_like(param))  # an adapter that is not the base model: checkpoint 1
    model.save_pretrained(str(tmp_path / "0001"))
    groups = _groups(model, tokenizer, store, hints=False, rewards=[1, 0, 0, 1])
    kept: dict[str, dict[str, Any]] = {}
    tiny = {"beta": 0.5, "learning_rate": 1e-12}  # an update of about 1e-12 (AdamW's step is about the rate)
    checkpoints = {1: str(tmp_path / "0001")}
    to_self = PolicyTrainer(model, tokenizer, store, kept_adapters=kept).train(
        groups, TrainConfig(reference_step=1, **tiny), checkpoints=checkpoints
    )
    to_base = PolicyTrainer(model, tokenizer, store).train(groups, TrainConfig(**tiny))
    assert to_self["kl"] < 1e-9 < 1e-4 < to_base["kl"] and list(kept) == list(checkpoints.values())

    with torch.no_grad():
        for _name, param in model.named_parameters():
            if param.requires_grad:
                param.add_(0.3 * torch.randn_like(param))  # the policy moves on from checkpoint 1
    moved = _lora(model)
    away = PolicyTrainer(model, tokenizer, store, kept_adapters=kept).train(
        groups, TrainConfig(reference_step=1, **tiny), checkpoints=checkpoints
    )
    assert away["kl"] > 1e-4  # measured against checkpoint 1, and the policy's own weights are put back after
    assert all(torch.allclose(moved[n], p, rtol=0, atol=1e-10) for n, p in _lora(model).items())

    with pytest.raises(FileNotFoundError, match="checkpoint 2 is not on this trainer's disk"):
        PolicyTrainer(model, tokenizer, store).train(groups, TrainConfig(beta=0.5, reference_step=2))

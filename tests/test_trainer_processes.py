"""Training with several processes (torch.distributed, gloo on CPU) gives the update of one process, and a
process that dies fails its step without touching what is served.

The same groups are trained by the policy trainer in this process and by 2 trainer processes, DDP and FSDP2:
same loss, same gradients (read from AdamW's first moment, which after one step is (1 - beta1) x gradient),
same weights after. Micro-batches that do not divide evenly over the ranks are part of the check.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from server_fixtures import start_server
from test_training_trainer import groups_for

from art_agents import TrainableModel, Trajectory, TrajectoryGroup, rollout
from art_agents.backends.remote import RemoteBackend
from art_agents.errors import ArtError
from art_agents.server.models.lora_model import load_peft_model, training_gpus
from art_agents.server.storage.token_store import TokenStore
from art_agents.server.training.policy_model import PolicyModel
from art_agents.server.training.ranks import trainable_weights
from art_agents.server.training.sequences import Policy
from art_agents.server.training.step_work import StepWork
from art_agents.server.training.trainer import PolicyTrainer
from art_agents.server.training.trainer_processes import ProcessTrainer, TrainerProcesses, TrainerProcessFailed
from art_agents.sft_config import TrainSFTConfig
from art_agents.train_config import ModelConfig, TrainConfig

BETA1 = 0.9  # torch AdamW's default


def perturbed_lora(tiny_model_path: Path, config: ModelConfig) -> Any:
    """The LoRA model every process loads, with B away from 0 (so A has gradients too)."""
    model, _ = load_peft_model(str(tiny_model_path), config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    return model


def gradients(state: dict) -> list[torch.Tensor]:
    return [entry["exp_avg"] / (1 - BETA1) for _, entry in sorted(state["state"].items())]


def assert_same_update(
    alone: tuple[dict, dict, dict], together: tuple[dict, dict, dict], metrics: tuple[str, ...]
) -> None:
    (m1, w1, s1), (m2, w2, s2) = alone, together
    for key in metrics:
        assert m2[key] == pytest.approx(m1[key], abs=1e-5), key
    for g1, g2 in zip(gradients(s1), gradients(s2), strict=True):
        torch.testing.assert_close(g2, g1, atol=1e-5, rtol=0)
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=1e-6, rtol=0)


@pytest.mark.parametrize("sharding", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])  # FSDP2's 15 s: in CI
def test_two_processes_train_as_one(
    sharding: str, tiny_model_path: Path, tokenizer: Any, store: TokenStore, tmp_path: Path
) -> None:
    config = ModelConfig(trainer_processes=2, trainer_sharding=sharding)  # type: ignore[arg-type]
    model = perturbed_lora(tiny_model_path, config)
    groups = groups_for(model, tokenizer, store)  # 10 sequences: 5 micro-batches of 2, 3 and 2 per rank
    rl = StepWork("rl", TrainConfig(micro_batch_size=2, max_grad_norm=1e6), Policy("m", 0), groups)
    sft = StepWork("sft", TrainSFTConfig(micro_batch_size=3, max_grad_norm=1e6), Policy("m", 0), groups[:1])
    every_pass = TrainConfig(  # old logprobs, reference logprobs (adapter off), checkpointed activations
        micro_batch_size=4, max_grad_norm=1e6, num_iterations=2, beta=0.1, gradient_checkpointing=True
    )
    rl_more = StepWork("rl", every_pass, Policy("m", 0), groups)
    processes = TrainerProcesses(str(tiny_model_path), config, tmp_path)
    try:
        for work, metrics in (
            (rl, ("loss", "grad_norm", "entropy", "tokens_trained")),
            (sft, ("loss", "grad_norm")),
            (rl_more, ("loss", "grad_norm", "kl", "clip_fraction")),
        ):
            alone = PolicyTrainer(copy.deepcopy(model), tokenizer, store)
            m1 = alone.run(work, None)
            policy = PolicyModel(copy.deepcopy(model), tokenizer)
            together = ProcessTrainer(processes, policy, None)
            progress: list[tuple[int, int]] = []
            m2 = together.run(work, lambda done, total, _, seen=progress: seen.append((done, total)))
            assert_same_update(
                (m1, trainable_weights(alone.model), alone.optimizer_state()),
                (m2, trainable_weights(policy.model), together.optimizer_state()),
                metrics,
            )
            assert progress and progress[-1][0] == progress[-1][1]
    finally:
        processes.stop()


@pytest.mark.slow  # two trainer processes (DDP) on one step that reads a checkpoint and hints
def test_two_processes_self_distill_as_one(
    tiny_model_path: Path, tokenizer: Any, store: TokenStore, tmp_path: Path
) -> None:
    config = ModelConfig(trainer_processes=2)
    model = perturbed_lora(tiny_model_path, config)
    model.save_pretrained(str(tmp_path / "teacher" / "0000"))  # the teacher and the KL's reference: this checkpoint
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name:
                param.mul_(1.5)  # the policy is no longer that checkpoint
    groups = groups_for(model, tokenizer, store)
    for g, group in enumerate(groups):
        for t, trajectory in enumerate(group.trajectories):
            trajectory.hint = None if (g + t) % 3 == 0 else f"the best answer has {g + t} letters"
    settings = TrainConfig(
        micro_batch_size=2, max_grad_norm=1e6, beta=0.1, reference_step=0, self_distill=1.0, teacher=0
    )
    work = StepWork("rl", settings, Policy("m", 0), groups, {0: str(tmp_path / "teacher" / "0000")})
    processes = TrainerProcesses(str(tiny_model_path), config, tmp_path)
    try:
        alone = PolicyTrainer(copy.deepcopy(model), tokenizer, store)
        m1 = alone.run(work, None)
        policy = PolicyModel(copy.deepcopy(model), tokenizer)
        together = ProcessTrainer(processes, policy, None)
        m2 = together.run(work, None)
        assert m1["self_distill_kl"] != 0 and m1["kl"] > 0 and 0 < m1["hinted_fraction"] < 1
        assert_same_update(
            (m1, trainable_weights(alone.model), alone.optimizer_state()),
            (m2, trainable_weights(policy.model), together.optimizer_state()),
            ("loss", "grad_norm", "kl", "self_distill_kl", "hinted_fraction"),
        )
    finally:
        processes.stop()


@pytest.mark.slow  # two trainer processes, one killed mid-step, then two new ones
def test_a_process_killed_mid_step_fails_it_by_rank_and_the_next_step_starts_anew(
    tiny_model_path: Path, tokenizer: Any, store: TokenStore, tmp_path: Path
) -> None:
    config = ModelConfig(trainer_processes=2)
    model = perturbed_lora(tiny_model_path, config)
    work = StepWork("rl", TrainConfig(micro_batch_size=1), Policy("m", 0), groups_for(model, tokenizer, store))
    processes = TrainerProcesses(str(tiny_model_path), config, tmp_path)
    policy = PolicyModel(model, tokenizer)
    before = trainable_weights(model)
    try:
        processes.train(work, before, None, None)  # starts the group
        victim = processes.pids[1]

        def kill_rank_1(done: int, total: int, metrics: dict[str, float]) -> None:
            if done == 1:  # rank 0's first micro-batch of 5: rank 1 cannot be past the gradient sync
                os.kill(victim, signal.SIGKILL)

        with pytest.raises(
            TrainerProcessFailed, match=rf"rank 1 \(pid {victim}\) died \(killed by SIGKILL.*keeps serving"
        ):
            ProcessTrainer(processes, policy, None).run(work, kill_rank_1)
        assert processes.pids == [] and not psutil.pid_exists(victim)
        for name, weight in trainable_weights(model).items():  # the server's copy was not touched
            torch.testing.assert_close(weight, before[name], atol=0, rtol=0)
        metrics = ProcessTrainer(processes, policy, None).run(work, None)
        assert metrics["optimizer_steps"] == 1 and len(processes.pids) == 2 and victim not in processes.pids
    finally:
        processes.stop()


@pytest.mark.slow  # two trainer processes started, one killed, the next step on new ones
async def test_a_served_model_trains_with_processes_and_serves_on_when_one_dies(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    config = ModelConfig(lora_rank=4, default_max_tokens=6, trainer_processes=2, trainer_sharding="fsdp")
    with start_server(tmp_path / "art") as url:
        backend = RemoteBackend(url)
        model = TrainableModel(name="pair", project="d", base_model=str(tiny_model_path), config=config)
        await model.register(backend)
        client = model.openai_client()

        async def groups() -> list[TrajectoryGroup]:
            async def attempt(text: str) -> Trajectory:
                async with rollout() as trajectory:
                    reply = await client.chat.completions.create(
                        model=model.name, messages=[{"role": "user", "content": text}], temperature=1.0
                    )
                    trajectory.reward = (reply.choices[0].message.content or "").count("a")
                return trajectory

            return [TrajectoryGroup([await attempt(f"q{g}") for _ in range(4)]) for g in range(2)]

        first = await model.train(await groups(), TrainConfig(learning_rate=1e-2, min_group_std=0), progress=False)
        assert first.step == 1 and first.metrics["optimizer_steps"] == 1
        workers = trainer_workers()
        assert len(workers) == 2
        workers[1].kill()
        with pytest.raises(
            ArtError, match=r"trainer process rank \d \(pid \d+\) died \(killed by SIGKILL.*keeps serving"
        ):
            await model.train(await groups(), TrainConfig(min_group_std=0), progress=False)
        assert await model.get_step() == 1
        reply = await client.chat.completions.create(model=model.name, messages=[{"role": "user", "content": "hi"}])
        assert reply.model == "pair@1"
        second = await model.train(await groups(), TrainConfig(min_group_std=0), progress=False)
        assert second.step == 2 and len(trainer_workers()) == 2
        await client.close()
        await backend.close()
    assert trainer_workers() == []  # stopped with the server


def trainer_workers() -> list[psutil.Process]:
    """The server's ranks: its own children (another test's trainer-node in this worker has its ranks as
    grandchildren), not yet exited."""
    workers = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE and "training.trainer_worker" in " ".join(child.cmdline()):
                workers.append(child)
    return workers


def test_where_training_runs_decides_whether_vllm_sleeps_during_a_step() -> None:
    assert training_gpus(ModelConfig(device="cuda")) == {0}  # the server's own trainer beside vLLM on GPU 0
    assert training_gpus(ModelConfig(device="cpu")) == set()
    apart = ModelConfig(device="cuda", trainer_processes=2, trainer_devices=["cuda:2", "cuda:3"])
    assert training_gpus(apart) == {2, 3}  # vLLM with tensor_parallel_size 2 keeps GPUs 0-1 awake
    with pytest.raises(ValueError, match="trainer_devices names 1 devices for trainer_processes=2"):
        ModelConfig(trainer_processes=2, trainer_devices=["cuda:1"])

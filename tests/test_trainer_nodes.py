"""Training across nodes: two "nodes" on this machine, each a process group of its own on loopback (gloo), node 1
started as `art-agents trainer-node` in a working folder of its own, the model's folder shared by both.

A step over 2 nodes x 1 rank makes one process's update (loss, gradients, weights) and refuses bad input as one
process does, keeping the group; a rank killed on node 1, and then the whole of node 1, fail their steps by node
and rank with the served weights untouched, and the next step forms the group again (with node 1 started anew
where it was killed whole); a node that never comes is named with the command that would start it.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from server_fixtures import free_port
from test_trainer_processes import assert_same_update, perturbed_lora
from test_training_trainer import groups_for

from art_agents.server.storage.token_store import TokenStore
from art_agents.server.training.policy_model import PolicyModel
from art_agents.server.training.ranks import trainable_weights
from art_agents.server.training.sequences import Policy, TrainingInputError
from art_agents.server.training.step_work import Progress, StepWork
from art_agents.server.training.trainer import PolicyTrainer
from art_agents.server.training.trainer_processes import ProcessTrainer, TrainerProcesses, TrainerProcessFailed
from art_agents.sft_config import TrainSFTConfig
from art_agents.train_config import ModelConfig, TrainConfig

NODE_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "multi-node" / "node.sh"


class Node:
    """A node started as a launcher would (examples/multi-node/node.sh: `art-agents trainer-node`), in its own
    folder and process group (so the whole node can be killed at once)."""

    def __init__(self, rendezvous: str, rank: int, folder: Path, shared: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        host, port = rendezvous.rsplit(":", 1)
        env = {"NODE_RANK": str(rank), "NODE0_ADDR": host, "RDZV_PORT": port, "ART_PATH": str(shared)}
        self.process = subprocess.Popen(
            ["bash", str(NODE_SCRIPT)],
            cwd=folder,
            env={**os.environ, **env, "ART_ENV": sys.prefix},
            start_new_session=True,
        )

    def rank_pids(self) -> list[int]:
        children = psutil.Process(self.process.pid).children(recursive=True)
        return [child.pid for child in children if "trainer_worker" in " ".join(child.cmdline())]

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@pytest.fixture
def two_nodes(
    tiny_model_path: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[TrainerProcesses, ModelConfig, list[Node]]]:
    """Node 0 is this process's TrainerProcesses; node 1 waits at the rendezvous (the list, so a test may replace
    it as an orchestrator would). The sharding is DDP unless a test parametrizes it."""
    rendezvous = f"127.0.0.1:{free_port()}"
    sharding = getattr(request, "param", "ddp")
    config = ModelConfig(trainer_processes=1, trainer_nodes=2, trainer_rendezvous=rendezvous, trainer_sharding=sharding)
    processes = TrainerProcesses(str(tiny_model_path), config, tmp_path / "shared")
    nodes = [Node(rendezvous, 1, tmp_path / "node1", tmp_path / "shared")]
    try:
        yield processes, config, nodes
    finally:
        processes.stop()
        for node in nodes:
            node.process.terminate()  # the node stops its ranks
            node.process.wait(30)


@pytest.fixture
def shared_store(tmp_path: Path) -> TokenStore:
    return TokenStore(tmp_path / "shared" / "tokens" / "store.sqlite")  # where every node's ranks read it


@pytest.mark.parametrize("two_nodes", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)], indirect=True)
def test_two_nodes_of_one_process_train_and_refuse_bad_input_as_one(
    two_nodes: tuple[TrainerProcesses, ModelConfig, list[Node]],
    tiny_model_path: Path,
    tokenizer: Any,
    shared_store: TokenStore,
) -> None:
    processes, config, nodes = two_nodes
    model = perturbed_lora(tiny_model_path, config)
    groups = groups_for(model, tokenizer, shared_store)  # 10 sequences: micro-batches of 2 split 3 and 2
    rl = StepWork("rl", TrainConfig(micro_batch_size=2, max_grad_norm=1e6), Policy("m", 0), groups)
    sft = StepWork("sft", TrainSFTConfig(micro_batch_size=3, max_grad_norm=1e6), Policy("m", 0), groups[:1])
    for work, metrics in ((rl, ("loss", "grad_norm", "entropy", "tokens_trained")), (sft, ("loss", "grad_norm"))):
        alone = PolicyTrainer(copy.deepcopy(model), tokenizer, shared_store)
        m1 = alone.run(work, None)
        policy = PolicyModel(copy.deepcopy(model), tokenizer)
        together = ProcessTrainer(processes, policy, None)
        m2 = together.run(work, None)
        assert_same_update(
            (m1, trainable_weights(alone.model), alone.optimizer_state()),
            (m2, trainable_weights(policy.model), together.optimizer_state()),
            metrics,
        )
    group = (processes.pids, nodes[0].rank_pids())
    with pytest.raises(TrainingInputError, match="no trajectory groups"):  # refused by both nodes' ranks alike
        processes.train(StepWork("rl", TrainConfig(), Policy("m", 0), []), trainable_weights(model), None, None)
    assert (processes.pids, nodes[0].rank_pids()) == group  # the group is fine: it trains on
    assert processes.train(rl, trainable_weights(model), None, None)[0]["optimizer_steps"] == 1


def kill_on_first_batch(kill: Callable[[], None]) -> Progress:
    def progress(done: int, total: int, metrics: dict[str, float]) -> None:
        if done == 1:  # rank 0's first micro-batch of 5: rank 1 cannot be past the gradient sync
            kill()

    return progress


@dataclass
class Stepping:
    """Two nodes, the model the server serves, and a step of 5 micro-batches per rank on it."""

    processes: TrainerProcesses
    config: ModelConfig
    nodes: list[Node]
    policy: PolicyModel
    work: StepWork

    def step(self, progress: Progress | None = None) -> dict[str, float]:
        return ProcessTrainer(self.processes, self.policy, None).run(self.work, progress)


@pytest.fixture
def stepping(
    two_nodes: tuple[TrainerProcesses, ModelConfig, list[Node]],
    tiny_model_path: Path,
    tokenizer: Any,
    shared_store: TokenStore,
) -> Stepping:
    processes, config, nodes = two_nodes
    model = perturbed_lora(tiny_model_path, config)
    work = StepWork("rl", TrainConfig(micro_batch_size=1), Policy("m", 0), groups_for(model, tokenizer, shared_store))
    return Stepping(processes, config, nodes, PolicyModel(model, tokenizer), work)


@pytest.mark.slow  # about 20 s on a quiet machine: the group is formed twice, node 1 started twice
def test_a_killed_node_fails_the_step_by_name_and_the_next_step_trains_with_the_node_started_again(
    stepping: Stepping, tmp_path: Path
) -> None:
    before = trainable_weights(stepping.policy.model)
    with pytest.raises(TrainerProcessFailed, match=r"node 1 \(ranks 1\) stopped beating.*keeps serving"):
        stepping.step(kill_on_first_batch(stepping.nodes[0].kill))
    for name, weight in trainable_weights(stepping.policy.model).items():  # the server's copy was not touched
        torch.testing.assert_close(weight, before[name], atol=0, rtol=0)
    restarted = Node(stepping.config.trainer_rendezvous or "", 1, tmp_path / "node1-again", tmp_path / "shared")
    stepping.nodes.append(restarted)  # as an orchestrator would
    assert stepping.step()["optimizer_steps"] == 1


@pytest.mark.slow  # about 20 s: the group is formed twice
def test_a_rank_killed_on_a_living_node_is_named_and_the_node_starts_new_ranks_for_the_next_step(
    stepping: Stepping,
) -> None:
    stepping.step()  # forms the group across both nodes
    (victim,) = stepping.nodes[0].rank_pids()
    with pytest.raises(TrainerProcessFailed, match=rf"node 1 rank 1 \(pid {victim} on .*\) died \(killed by SIGKILL"):
        stepping.step(kill_on_first_batch(lambda: os.kill(victim, signal.SIGKILL)))
    assert stepping.step()["optimizer_steps"] == 1
    assert stepping.nodes[0].rank_pids() not in ([], [victim])


def test_a_rank_that_fails_on_another_node_is_named_with_its_own_error(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base model is a folder relative to node 0's working folder, so node 1's rank cannot load it: the step
    fails with that rank's error, not with the collective that node 0's rank lost."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base").symlink_to(tiny_model_path)
    rendezvous = f"127.0.0.1:{free_port()}"
    config = ModelConfig(trainer_processes=1, trainer_nodes=2, trainer_rendezvous=rendezvous)
    processes = TrainerProcesses("base", config, tmp_path / "shared")
    node = Node(rendezvous, 1, tmp_path / "node1", tmp_path / "shared")
    try:
        with pytest.raises(TrainerProcessFailed, match=r"trainer node 1 rank 1 failed: .*offline mode.*keeps serving"):
            for _ in range(2):  # the failure shows at joining or at the first step, whichever it reaches first
                processes.train(StepWork("rl", TrainConfig(), Policy("m", 0), []), {}, None, None)
    finally:
        processes.stop()
        node.process.terminate()
        node.process.wait(30)


def test_a_node_that_never_comes_is_named_with_its_command(tiny_model_path: Path, tmp_path: Path) -> None:
    rendezvous = f"127.0.0.1:{free_port()}"
    config = ModelConfig(trainer_processes=1, trainer_nodes=2, trainer_rendezvous=rendezvous, trainer_timeout_s=3)
    processes = TrainerProcesses(str(tiny_model_path), config, tmp_path)
    try:
        with pytest.raises(
            TrainerProcessFailed,
            match=rf"node 1 did not join \(is `art-agents trainer-node --rendezvous {rendezvous} --node-rank 1`",
        ):
            processes.train(StepWork("rl", TrainConfig(), Policy("m", 0), []), {}, None, None)
    finally:
        processes.stop()


def test_several_nodes_need_processes_and_an_address(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ART_TRAINER_RENDEZVOUS", raising=False)
    with pytest.raises(ValueError, match=r"trainer_nodes=2 needs trainer_processes >= 1"):
        ModelConfig(trainer_nodes=2)
    processes = TrainerProcesses(str(tiny_model_path), ModelConfig(trainer_processes=1, trainer_nodes=2), tmp_path)
    with pytest.raises(
        TrainerProcessFailed, match=r"set ModelConfig\.trainer_rendezvous or the server's ART_TRAINER_RENDEZVOUS"
    ):
        processes.train(StepWork("rl", TrainConfig(), Policy("m", 0), []), {}, None, None)


@pytest.mark.slow  # forms 4 groups
def test_the_nodes_benchmark_runs_on_the_tiny_model() -> None:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "trainer_nodes.py"
    done = subprocess.run(
        [sys.executable, str(script), "--tiny", "--rounds", "1"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2x1 vs 1x2 step:" in done.stdout and "2x1 form:" in done.stdout

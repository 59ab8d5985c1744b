"""What several nodes cost a trainer group: forming it (the rendezvous) and handing each step over.

Two groups of the same size train the same groups of a random Qwen3-shaped model from the same weights: `1x2`,
one node with 2 trainer processes (the one-machine group), and `2x1`, 2 nodes with 1 process each, node 1 being
`art-agents trainer-node` in a folder of its own on this machine (loopback, gloo). Each round, each side is
stopped and trains twice: the first step forms the group (every rank starts, loads the model and meets in the
server's store), the second is a step of a formed group. Figures: the steady step's seconds and the forming
overhead (first step minus steady step), medians with min-max over interleaved rounds after a warm-up; the
ratio is the median of per-round ratios of 2x1 against 1x2. On one machine both sides share its cores, so the
difference is what the node path adds (a rank that gets its work from rank 0 over the group rather than from
its server's socket, a node's heartbeat and the server polling the store), not network time between machines.
`--device cuda` (the GPU check, not run: this machine has none) needs 2 GPUs: 1x2 trains on cuda:0 and cuda:1
over nccl, and 2x1 on cuda:0 with node 1 seeing only GPU 1 (CUDA_VISIBLE_DEVICES), so nccl joins two "nodes".

    python benchmarks/trainer_nodes.py [--rounds 5] [--tiny] [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step import stored_groups
from timing import Summary, ratio
from trainer_processes import add_step_options, step_inputs

SIDES = {"1x2": (1, 2), "2x1": (2, 1)}  # name -> (nodes, processes per node)


def measure(
    path: Path, rows: list[dict[str, Any]], train_config: Any, work: Path, rounds: int, device: str
) -> dict[str, Summary]:
    """Per side, `form` (first step minus steady step) and `step` (steady step) seconds for each round."""
    from art_agents.backends.ports import free_port
    from art_agents.server.models.lora_model import load_peft_model
    from art_agents.server.storage.token_store import TokenStore
    from art_agents.server.training.ranks import trainable_weights
    from art_agents.server.training.sequences import Policy
    from art_agents.server.training.step_work import StepWork
    from art_agents.server.training.trainer_processes import TrainerProcesses
    from art_agents.train_config import ModelConfig

    shared = work / "shared"
    store = TokenStore(shared / "tokens" / "store.sqlite")
    model, tokenizer = load_peft_model(str(path), ModelConfig())
    step = StepWork("rl", train_config, Policy("bench", 0), stored_groups(tokenizer, rows, store))
    start = trainable_weights(model)
    groups: dict[str, TrainerProcesses] = {}
    nodes: list[subprocess.Popen] = []
    for name, (node_count, per_node) in SIDES.items():
        rendezvous = f"127.0.0.1:{free_port()}" if node_count > 1 else None
        devices = [f"cuda:{i}" for i in range(per_node)] if device == "cuda" else []
        config = ModelConfig(
            device=device,
            trainer_processes=per_node,
            trainer_devices=devices,
            trainer_nodes=node_count,
            trainer_rendezvous=rendezvous,
        )
        groups[name] = TrainerProcesses(str(path), config, shared)
        for rank in range(1, node_count):
            folder = work / f"{name}-node{rank}"
            folder.mkdir()
            command = [sys.executable, "-m", "art_agents", "trainer-node", "--rendezvous", str(rendezvous)]
            gpus = {"CUDA_VISIBLE_DEVICES": str(rank)} if device == "cuda" else {}  # a node's own GPU
            env = {**os.environ, **gpus}
            nodes.append(subprocess.Popen([*command, "--node-rank", str(rank)], cwd=folder, env=env))
    figures: dict[str, list[float]] = {f"{name} {kind}": [] for name in SIDES for kind in ("form", "step")}
    try:
        for r in range(1 + rounds):  # the first is a warm-up
            for name, group in groups.items():
                group.stop()
                first, steady = (timed(group, step, start) for _ in range(2))
                print(f"round {r} {name}: first step {first:.2f} s, formed group's step {steady:.2f} s", flush=True)
                if r:
                    figures[f"{name} form"].append(first - steady)
                    figures[f"{name} step"].append(steady)
    finally:
        for group in groups.values():
            group.stop()
        for node in nodes:
            stop_node(node)
    return {name: Summary.of(values) for name, values in figures.items()}


def stop_node(node: subprocess.Popen) -> None:
    """SIGTERM (the node stops its ranks), then SIGKILL if it does not end."""
    node.terminate()
    try:
        node.wait(30)
    except subprocess.TimeoutExpired:
        node.kill()
        node.wait()


def timed(group: Any, step: Any, weights: dict[str, Any]) -> float:
    """Seconds of one step from `weights` and a fresh optimizer."""
    began = time.perf_counter()
    group.train(step, weights, None, None)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    add_step_options(parser)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        path, rows, train_config = step_inputs(args, work)
        summaries = measure(path, rows, train_config, work, args.rounds, args.device)
    backend = "nccl" if args.device == "cuda" else "gloo"
    print(f"\n{args.groups * args.group_size * args.completion_tokens} trained tokens a step, loopback, {backend}")
    for kind in ("step", "form"):
        for name in SIDES:
            print(f"{name} {kind:>4}: {summaries[f'{name} {kind}'].format('s', 1.0, 2)}")
    print(f"2x1 vs 1x2 step: {ratio(summaries['2x1 step'], summaries['1x2 step']).format('x', 1.0, 2)}")


if __name__ == "__main__":
    main()

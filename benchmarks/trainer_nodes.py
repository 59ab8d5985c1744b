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

    python benchmarks/trainer_nodes.py [--rounds 5] [--tiny]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step import make_batch, stored_groups
from timing import Summary, ratio

SIDES = {"1x2": (1, 2), "2x1": (2, 1)}  # name -> (nodes, processes per node)


def measure(path: Path, rows: list[dict[str, Any]], train_config: Any, work: Path, rounds: int) -> dict[str, Summary]:
    """Per side, `form` (first step minus steady step) and `step` (steady step) seconds for each round."""
    from art_agents.server.lora_model import load_peft_model
    from art_agents.server.storage.token_store import TokenStore
    from art_agents.server.training.ranks import trainable_weights
    from art_agents.server.training.sequences import Policy
    from art_agents.server.training.step_work import StepWork
    from art_agents.server.training.trainer_processes import TrainerProcesses, free_port
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
        config = ModelConfig(trainer_processes=per_node, trainer_nodes=node_count, trainer_rendezvous=rendezvous)
        groups[name] = TrainerProcesses(str(path), config, shared)
        for rank in range(1, node_count):
            folder = work / f"{name}-node{rank}"
            folder.mkdir()
            command = [sys.executable, "-m", "art_agents", "trainer-node", "--rendezvous", str(rendezvous)]
            nodes.append(subprocess.Popen([*command, "--node-rank", str(rank)], cwd=folder))
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
            node.terminate()
            node.wait(30)
    return {name: Summary.of(values) for name, values in figures.items()}


def timed(group: Any, step: Any, weights: dict[str, Any]) -> float:
    """Seconds of one step from `weights` and a fresh optimizer."""
    began = time.perf_counter()
    group.train(step, weights, None, None)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=32)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="the test suite's tiny model (a quick check of the script)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from art_agents.server.ops.tiny_model import build_tiny_model
    from art_agents.train_config import TrainConfig

    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        shape = {} if args.tiny else {"hidden_size": 256, "num_layers": 6}
        path = build_tiny_model(work / "model", **shape)
        rows = make_batch(AutoTokenizer.from_pretrained(path), args.groups, args.group_size, args.completion_tokens)
        train_config = TrainConfig(learning_rate=1e-5, micro_batch_size=args.micro_batch_size, min_group_std=0.0)
        summaries = measure(path, rows, train_config, work, args.rounds)
    print(f"\n{args.groups * args.group_size * args.completion_tokens} trained tokens a step, loopback, gloo")
    for kind in ("step", "form"):
        for name in SIDES:
            print(f"{name} {kind:>4}: {summaries[f'{name} {kind}'].format('s', 1.0, 2)}")
    print(f"2x1 vs 1x2 step: {ratio(summaries['2x1 step'], summaries['1x2 step']).format('x', 1.0, 2)}")


if __name__ == "__main__":
    main()

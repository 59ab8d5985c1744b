"""Training throughput of trainer processes (torch.distributed, DDP or FSDP2) vs the server's own process.

Every side trains the same groups of a random Qwen3-shaped model (hidden 256, 6 layers) with ModelConfig's LoRA
and the same TrainConfig, from the same weights each round: `PolicyTrainer.train` in this process, then
`TrainerProcesses.train` with 1 process, 2 processes with DDP and 2 with FSDP2 (`--sides`). A side's figure is
trained tokens per second over its whole call; for the processes that includes handing over the weights and
optimizer state and taking the new ones back. The sides run interleaved after one warm-up round; figures are
medians with their min-max, ratios the median of per-round ratios against the in-process side. On a CPU the
processes share its cores (each gets cores / processes threads), so 2 processes measure what the group costs,
not what a second device gains; `--device cuda` puts the model and one process on the GPU (the GPU check:
1 process should match the in-process trainer within 5%).

    python benchmarks/trainer_processes.py [--rounds 5] [--sides in-process,1,ddp2,fsdp2] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step import make_batch, stored_groups
from timing import Summary, ratio

SIDES = {"in-process": (0, "ddp"), "1": (1, "ddp"), "ddp2": (2, "ddp"), "fsdp2": (2, "fsdp")}


def trainer_sides(
    path: Path, rows: list[dict[str, Any]], train_config: Any, device: str, work: Path, names: list[str]
) -> tuple[dict[str, Callable[[], float]], Callable[[], None]]:
    """Each named side as a function training one step and returning its trained tokens per second; and a
    function stopping the sides' processes."""
    from art_agents.server.models.lora_model import load_peft_model
    from art_agents.server.storage.token_store import TokenStore
    from art_agents.server.training.ranks import trainable_weights
    from art_agents.server.training.sequences import Policy
    from art_agents.server.training.step_work import StepWork
    from art_agents.server.training.trainer import PolicyTrainer
    from art_agents.server.training.trainer_processes import TrainerProcesses
    from art_agents.train_config import ModelConfig

    model_dir = work / "model-dir"
    store = TokenStore(model_dir / "tokens" / "store.sqlite")  # where trainer processes read it
    model, tokenizer = load_peft_model(str(path), ModelConfig(device=device))
    work_item = StepWork("rl", train_config, Policy("bench", 0), stored_groups(tokenizer, rows, store))
    start = trainable_weights(model)
    sides: dict[str, Callable[[], float]] = {}
    groups: list[TrainerProcesses] = []

    def timed(step: Callable[[], dict[str, float]]) -> Callable[[], float]:
        def run() -> float:
            _synchronize(device)
            began = time.perf_counter()
            metrics = step()
            _synchronize(device)
            return metrics["tokens_trained"] / (time.perf_counter() - began)

        return run

    for name in names:
        processes, sharding = SIDES[name]
        if not processes:
            sides[name] = timed(lambda: _from_start(PolicyTrainer(model, tokenizer, store), start, work_item))
            continue
        devices = [_indexed(device)] * processes if device != "cpu" else []
        config = ModelConfig(
            device=device, trainer_processes=processes, trainer_sharding=sharding, trainer_devices=devices
        )
        group = TrainerProcesses(str(path), config, model_dir)
        groups.append(group)
        sides[name] = timed(lambda group=group: group.train(work_item, start, None, None)[0])

    def stop() -> None:
        for group in groups:
            group.stop()

    return sides, stop


def _from_start(trainer: Any, start: dict[str, Any], work: Any) -> dict[str, float]:
    """A step from the round's starting weights and a fresh optimizer, as the processes get them."""
    from art_agents.server.training.ranks import set_trainable_weights

    set_trainable_weights(trainer.model, start)
    return trainer.run(work, None)


def _indexed(device: str) -> str:
    return "cuda:0" if device == "cuda" else device


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def measure(sides: dict[str, Callable[[], float]], rounds: int) -> dict[str, Summary]:
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(1 + rounds):  # the first is a warm-up (and starts the processes)
        for name, side in sides.items():
            rate = side()
            print(f"round {r} {name}: {rate:,.0f} tokens/s", flush=True)
            if r:
                rates[name].append(rate)
    return {name: Summary.of(values) for name, values in rates.items()}


def add_step_options(parser: argparse.ArgumentParser) -> None:
    """The step every trainer-group benchmark trains: its groups, their size, the micro-batch and the model."""
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--completion-tokens", type=int, default=32)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="the test suite's tiny model (a quick check of the script)")


def step_inputs(args: argparse.Namespace, work: Path) -> tuple[Path, list[dict[str, Any]], Any]:
    """The model built under `work` (hidden 256, 6 layers, or the tiny one), the step's rows and its TrainConfig."""
    from transformers import AutoTokenizer

    from art_agents.server.ops.tiny_model import build_tiny_model
    from art_agents.train_config import TrainConfig

    shape = {} if args.tiny else {"hidden_size": 256, "num_layers": 6}
    path = build_tiny_model(work / "model", **shape)
    rows = make_batch(AutoTokenizer.from_pretrained(path), args.groups, args.group_size, args.completion_tokens)
    return path, rows, TrainConfig(learning_rate=1e-5, micro_batch_size=args.micro_batch_size, min_group_std=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sides", default="in-process,1,ddp2,fsdp2", help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--device", default="cpu")
    add_step_options(parser)
    args = parser.parse_args()
    names = [n.strip() for n in args.sides.split(",") if n.strip()]
    if unknown := [n for n in names if n not in SIDES]:
        raise SystemExit(f"unknown sides {unknown}; choose from {', '.join(SIDES)}")
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        path, rows, train_config = step_inputs(args, work)
        sides, stop = trainer_sides(path, rows, train_config, args.device, work, names)
        try:
            summaries = measure(sides, args.rounds)
        finally:
            stop()
    trained = args.groups * args.group_size * args.completion_tokens
    print(f"\n{trained} trained tokens a step, micro-batch {args.micro_batch_size}, device {args.device}")
    for name, summary in summaries.items():
        line = f"{name:>10}: {summary.format('tokens/s', 1.0, 0)}"
        if name != names[0]:
            line += f"   vs {names[0]}: {ratio(summary, summaries[names[0]]).format('x', 1.0, 2)}"
        print(line)


if __name__ == "__main__":
    main()

"""The server's resident memory while it serves and trains SmolLM2: what owning a policy beside the engine costs.

`art-agents serve` runs as its own process (LocalBackend). The script registers the model, samples groups of
rollouts through the OpenAI SDK, trains `--steps` steps on them, and reads the server's /proc status: resident
memory once registered, after the steps, and the peak (VmHWM). Only the client API is used, so the same script
measures any commit: run it with another checkout's python to compare (the figures in docs/benchmarks.md).
`--system-tokens` puts an agent's system prompt (made-up tool descriptions) before each rollout's task, the
shape of an MCP•RL batch (its head is ~700-850 tokens on SmolLM2).

    python benchmarks/train_memory.py [--steps 2] [--json-out F]   (--tiny: the tiny test model, a smoke run)
    python benchmarks/train_memory.py --system-tokens 800 --micro-batch-size 4   # MCP•RL-shaped
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_setup import smollm2_gguf
from grpo_step import tool_list

PROMPT = "Name three colours, one per line."


def status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


async def groups_of(model: Any, groups: int, size: int, max_tokens: int, system_tokens: int) -> list[Any]:
    from art_agents.trajectory import Trajectory, TrajectoryGroup

    client = model.openai_client()
    head = [{"role": "system", "content": tool_list(system_tokens // 14)}] if system_tokens else []
    messages = [*head, {"role": "user", "content": PROMPT}]

    async def one(seed: int) -> Trajectory:
        answer = await client.chat.completions.create(
            model=model.name, messages=messages, max_tokens=max_tokens, temperature=1.0, seed=seed
        )
        choice = answer.choices[0]
        return Trajectory(messages_and_choices=[*messages, choice], reward=float(len(choice.message.content or "")))

    try:
        return [TrajectoryGroup(await asyncio.gather(*(one(g * size + i) for i in range(size)))) for g in range(groups)]
    finally:
        await client.close()


async def main(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from art_agents.backends.local import LocalBackend
    from art_agents.model import TrainableModel
    from art_agents.train_config import ModelConfig, TrainConfig

    if args.tiny:
        from art_agents.server.ops.tiny_model import build_tiny_model

        base_model, gguf_file = str(build_tiny_model(folder / "tiny")), None
    else:
        base_model, gguf_file = smollm2_gguf()
    backend = LocalBackend(folder / "art")
    model = TrainableModel(name="mem", project="bench", base_model=base_model, config=ModelConfig(gguf_file=gguf_file))
    try:
        began = time.monotonic()
        await model.register(backend)
        assert backend._process is not None
        pid = backend._process.pid
        registered = status_mb(pid, "VmRSS")
        config = TrainConfig(micro_batch_size=args.micro_batch_size)
        for step in range(args.steps):
            groups = await groups_of(model, args.groups, args.group_size, args.max_tokens, args.system_tokens)
            await model.train(groups, config, progress=False)
            print(f"step {step + 1}: resident {status_mb(pid, 'VmRSS'):.1f} MiB", flush=True)
        return {
            "steps": args.steps,
            "rss_mb_registered": round(registered, 1),
            "rss_mb_after_steps": round(status_mb(pid, "VmRSS"), 1),
            "rss_mb_peak": round(status_mb(pid, "VmHWM"), 1),
            "wall_s": round(time.monotonic() - began, 1),
        }
    finally:
        await backend.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--system-tokens", type=int, default=0, help="about this many tokens of system prompt (tools)")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--tiny", action="store_true", help="the tiny test model instead of SmolLM2 (a smoke run)")
    p.add_argument("--json-out", type=Path)
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    with tempfile.TemporaryDirectory(prefix="art-train-memory-") as tmp:
        result = asyncio.run(main(arguments, Path(tmp)))
    print(json.dumps(result, indent=2))
    if arguments.json_out:
        arguments.json_out.write_text(json.dumps(result, indent=2))

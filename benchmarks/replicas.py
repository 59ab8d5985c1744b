"""Serving throughput of a model with 2 transformers replicas behind the router vs 1, same server and requests.

One `LocalBackend` server serves two registrations of the same random Qwen3-shaped model (hidden 256, 6
layers): `ModelConfig(replicas=1)` and `replicas=2`. Each round sends the same `--requests` concurrent chat
completions of exactly `--max-tokens` tokens (each its own rollout, so the router spreads them) through the
OpenAI SDK to one, then the other; after one warm-up round, each side's completion tokens per second is the median
over the rounds with its min-max, and the ratio is the median of the per-round ratios. On a CPU the two
replicas share the same cores, so this measures what the router costs and what splitting a batch gains
there; on a machine with a device per replica they would not compete.

    python benchmarks/replicas.py [--rounds 5] [--requests 32] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Summary, ratio


async def register(backend: object, base_model: str, replicas: int, max_tokens: int, batch: int) -> str:
    from art_agents import ModelConfig, TrainableModel

    config = ModelConfig(replicas=replicas, max_batch_size=batch, default_max_tokens=max_tokens, lora_rank=8)
    model = TrainableModel(name=f"replicas-{replicas}", project="bench", base_model=base_model, config=config)
    await model.register(backend)
    return model.name


async def fire(base_url: str, name: str, requests: int, max_tokens: int) -> float:
    """Completion tokens per second of `requests` concurrent completions, each its own rollout."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
    began = time.perf_counter()
    replies = await asyncio.gather(
        *(
            client.chat.completions.create(
                model=name,
                messages=[{"role": "user", "content": f"Request {i}: tell me about the number {i}."}],
                max_tokens=max_tokens,
                extra_headers={"x-art-rollout-id": f"bench-{i}-{began}"},
            )
            for i in range(requests)
        )
    )
    seconds = time.perf_counter() - began
    await client.close()
    return sum(r.usage.completion_tokens for r in replies) / seconds


async def measure(args: argparse.Namespace, folder: Path) -> dict[int, Summary]:
    from art_agents import LocalBackend
    from art_agents.server.ops.tiny_model import build_tiny_model

    shape = {} if args.tiny else {"hidden_size": 256, "num_layers": 6}
    base_model = str(build_tiny_model(folder / "model", **shape))
    backend = LocalBackend(folder / "art")
    rates: dict[int, list[float]] = {1: [], 2: []}
    try:
        names = {n: await register(backend, base_model, n, args.max_tokens, args.requests) for n in rates}
        for round_ in range(1 + args.rounds):  # the first is a warm-up
            for n, name in names.items():
                rate = await fire(backend.base_url, name, args.requests, args.max_tokens)
                print(f"round {round_} {n} replica(s): {rate:.0f} tokens/s", flush=True)
                if round_:
                    rates[n].append(rate)
    finally:
        await backend.close()
    return {n: Summary.of(values) for n, values in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny model (checks the script runs)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rates = asyncio.run(measure(args, Path(folder)))
    for n, summary in rates.items():
        print(f"{n} replica{'s' if n > 1 else ''}: {summary.format('tokens/s', 1, 0)}")
    print(f"summary: throughput 2 replicas / 1 {ratio(rates[2], rates[1]).format('x', 1, 2)}")


if __name__ == "__main__":
    main()

"""The server under the load users put on it: many rollout clients at once, and training every minute.

`art-agents serve` runs as its own process with the tiny model; `--clients` concurrent clients (the
real OpenAI SDK, half of them streaming) ask for short completions without pause for `--minutes`,
and a train call on the latest completions runs every minute. Each request is agent-shaped: one of four
long system prompts (shared heads the prefix cache serves) and a question of its own (new blocks that fill the
cache until it evicts). Printed: requests served and failed (deliberate 503s counted apart), p50/p99 latency,
throughput, the server's resident memory at minute 1, at its peak and at the end, and token-store rows against
completions served. Run it with `--prefix-cache-mb 0` too: the peaks' difference is what the cache costs, which
should stay within its budget + 10%.

    python benchmarks/load.py [--clients 64] [--minutes 5] [--max-tokens 16] [--prefix-cache-mb 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import openai


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Tally:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.ok = self.busy = 0
        self.failures: list[str] = []
        self.recent: list[tuple[str, str]] = []  # (completion id, text) of the latest answers

    def record(self, latency: float, completion_id: str, text: str) -> None:
        self.latencies.append(latency)
        self.ok += 1
        self.recent = [*self.recent[-63:], (completion_id, text)]


HEADS = [
    " ".join(f"Rule {rule} of agent {agent}: answer briefly, use tool number {rule} when asked." for rule in range(12))
    for agent in range(4)
]


async def client_loop(index: int, base_url: str, name: str, stop_at: float, tally: Tally, max_tokens: int) -> None:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    stream = index % 2 == 1
    generator = random.Random(index)
    while time.monotonic() < stop_at:
        question = " ".join(str(generator.randrange(10**6)) for _ in range(8))
        messages = [
            {"role": "system", "content": HEADS[index % len(HEADS)]},
            {"role": "user", "content": f"client {index} asks question {question}"},
        ]
        started = time.perf_counter()
        try:
            if stream:
                chunks = await client.chat.completions.create(
                    model=name,
                    messages=messages,
                    max_tokens=max_tokens,
                    stream=True,  # type: ignore[arg-type]
                )
                text, completion_id = "", ""
                async for chunk in chunks:
                    completion_id = chunk.id
                    text += "".join(choice.delta.content or "" for choice in chunk.choices)
            else:
                answer = await client.chat.completions.create(model=name, messages=messages, max_tokens=max_tokens)  # type: ignore[arg-type]
                completion_id, text = answer.id, answer.choices[0].message.content or ""
            tally.record(time.perf_counter() - started, completion_id, text)
        except openai.APIStatusError as exc:
            if exc.status_code in (429, 503):
                tally.busy += 1
                await asyncio.sleep(float(exc.response.headers.get("retry-after", "1")))
            else:
                tally.failures.append(f"{exc.status_code}: {exc.message[:120]}")
        except Exception as exc:  # a broken connection, a timeout: a failure to report
            tally.failures.append(f"{type(exc).__name__}: {exc}"[:160])
    await client.close()


async def trainer_loop(model: Any, stop_at: float, tally: Tally, steps: list[dict[str, float]]) -> None:
    from art_agents import Trajectory, TrajectoryGroup
    from art_agents.train_config import TrainConfig
    from art_agents.trajectory import Turn

    while time.monotonic() + 60 < stop_at:
        await asyncio.sleep(60)
        recent = tally.recent[-8:]
        trajectories = [
            Trajectory(
                messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": text}],
                turns=[Turn(index=1, completion_id=cid)],
                reward=float(len(text) % 3),
            )
            for cid, text in recent
        ]
        groups = [TrajectoryGroup(trajectories[i : i + 4]) for i in range(0, len(trajectories), 4)]
        started = time.perf_counter()
        result = await model.train(groups, TrainConfig(learning_rate=1e-4, max_staleness=1), progress=False)
        steps.append({"step": result.step, "train_s": time.perf_counter() - started})


async def main(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The load run, with the tiny model and the server's files in `folder`."""
    from art_agents.backends.local import LocalBackend
    from art_agents.model import TrainableModel
    from art_agents.server.ops.tiny_model import build_tiny_model
    from art_agents.server.storage.token_store import TokenStore
    from art_agents.train_config import ModelConfig

    tiny = build_tiny_model(folder / "tiny")
    backend = LocalBackend(folder / "art")
    config = ModelConfig(prefix_cache_mb=args.prefix_cache_mb)
    model = TrainableModel(name="load", project="bench", base_model=str(tiny), config=config)
    tally, steps, memory, samples = Tally(), [], {}, []
    try:  # the server stops (even if registering fails) before the caller removes its folder
        await model.register(backend)
        assert backend._process is not None
        pid = backend._process.pid
        began = time.monotonic()
        stop_at = began + 60 * args.minutes

        async def sample_memory() -> None:
            while time.monotonic() < stop_at:
                await asyncio.sleep(5)
                minute = int((time.monotonic() - began) // 60) + 1
                memory[minute] = resident_mb(pid)
                samples.append(memory[minute])

        await asyncio.gather(
            *(client_loop(i, backend.base_url, "load", stop_at, tally, args.max_tokens) for i in range(args.clients)),
            trainer_loop(model, stop_at, tally, steps),
            sample_memory(),
        )
        wall = time.monotonic() - began
        rows = TokenStore(folder / "art" / "bench" / "models" / "load" / "tokens" / "store.sqlite").count()
    finally:
        await backend.close()
    latencies = sorted(tally.latencies)
    first, last = memory.get(1, float("nan")), memory[max(memory)] if memory else float("nan")
    return {
        "clients": args.clients,
        "minutes": args.minutes,
        "prefix_cache_mb": args.prefix_cache_mb,
        "served": tally.ok,
        "failed": len(tally.failures),
        "failures": tally.failures[:5],
        "busy_503": tally.busy,
        "p50_s": statistics.median(latencies) if latencies else None,
        "p99_s": latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
        "requests_per_s": tally.ok / wall,
        "train_steps": steps,
        "rss_mb_by_minute": {minute: round(mb, 1) for minute, mb in sorted(memory.items())},
        "rss_growth_minute_1_to_end": last / first - 1,
        "rss_mb_peak": round(max(samples), 1) if samples else None,
        "store_rows": rows,
        "store_rows_minus_served": rows - tally.ok,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--prefix-cache-mb", type=float, default=32.0, help="the engine's prefix cache budget")
    parser.add_argument("--json-out")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="art-load-") as folder:
        result = asyncio.run(main(options, Path(folder)))
    print(json.dumps(result, indent=2))
    if options.json_out:
        Path(options.json_out).write_text(json.dumps(result, indent=2))

"""The server under the soak users put on it: many rollout clients of every protocol at once, training steps
committing, and clients that hang up mid-stream.

`art-agents serve` runs as its own process with the tiny model; `--clients` concurrent clients ask for short
completions without pause for `--minutes`, spread evenly over every protocol the server speaks (Chat
Completions, Responses, Anthropic Messages, legacy Completions), streamed and not, each through its own SDK
(soak_clients.py). A train call on the latest chat completions runs every `--train-every` seconds, and
`--disconnect-every` seconds after the last one, one more client opens a stream and hangs up after its first event.
Each request is agent-shaped: one of four long system prompts (shared heads the prefix cache serves) and a
question of its own (new blocks that fill the cache until it evicts).

Printed: per protocol, requests served and failed (deliberate 429/503 refusals counted apart) and p50/p99
latency; the steps committed and whether any was lost (an answer older than a step whose train call returned
before it was asked, a committed step never served, or the last one not served at the end); the server's
resident memory after warm-up (when the first step has committed) and at the end, and their ratio (goal: within
10%); token-store rows against completions served. Run it with `--prefix-cache-mb 0` too: the peaks'
difference is what the cache costs, which should stay within its budget + 10%.

    python benchmarks/load.py [--clients 64] [--minutes 10] [--train-every 60] [--disconnect-every 3]
                              [--max-tokens 16] [--prefix-cache-mb 32] [--protocols chat,responses,...]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path: finds soak_clients
from soak_clients import PROTOCOLS, Calls, Tally, client_loop, disconnect_loop

NAME = "load"


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def trainer_loop(model: Any, every_s: float, stop_at: float, tally: Tally, steps: list[dict[str, Any]]) -> None:
    """A train call on the latest chat completions every `every_s`; each step it returns is committed."""
    from art_agents import Trajectory, TrajectoryGroup
    from art_agents.train_config import TrainConfig
    from art_agents.trajectory import Turn

    while time.monotonic() + every_s < stop_at:
        await asyncio.sleep(every_s)
        trajectories = [
            Trajectory(
                messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": text}],
                turns=[Turn(index=1, completion_id=cid)],
                reward=float(i % 3),  # a spread in every group, so no step is skipped
            )
            for i, (cid, text) in enumerate(tally.recent[-8:])
        ]
        groups = [TrajectoryGroup(trajectories[i : i + 4]) for i in range(0, len(trajectories), 4)]
        started = time.perf_counter()
        try:
            result = await model.train(groups, TrainConfig(learning_rate=1e-4, max_staleness=1), progress=False)
        except Exception as exc:
            steps.append({"failed": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        tally.committed.append(result.step)
        steps.append({"step": result.step, "train_s": round(time.perf_counter() - started, 2)})


async def sample_memory(pid: int, stop_at: float, tally: Tally, memory: dict[str, float]) -> None:
    """Every 5 s: the server's resident memory; `warm` is its first sample once a step has committed."""
    began = time.monotonic()
    while time.monotonic() + 5.0 < stop_at:  # the end is sampled once the clients have stopped
        await asyncio.sleep(5.0)
        mb = resident_mb(pid)
        memory["peak"] = max(memory.get("peak", 0.0), mb)
        elapsed = min(time.monotonic(), stop_at - 1.0) - began  # a late wake-up still counts in the last minute
        memory[f"minute {int(elapsed // 60) + 1}"] = mb  # its last sample
        if tally.committed and "warm" not in memory:
            memory["warm"] = mb


async def steps_at_end(calls: Calls) -> list[int]:
    """After the soak: the step each protocol answers with (each must be the last committed one)."""
    return [(await calls.answer(protocol, False, "check", "the last step?")).step for protocol in PROTOCOLS]


async def soak(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The soak, with the tiny model and the server's files in `folder`."""
    from art_agents.backends.local import LocalBackend
    from art_agents.model import TrainableModel
    from art_agents.server.ops.tiny_model import build_tiny_model
    from art_agents.server.storage.token_store import TokenStore
    from art_agents.train_config import ModelConfig

    tiny = build_tiny_model(folder / "tiny")
    backend = LocalBackend(folder / "art")
    config = ModelConfig(prefix_cache_mb=args.prefix_cache_mb)
    model = TrainableModel(name=NAME, project="bench", base_model=str(tiny), config=config)
    kinds = [(protocol, stream) for protocol in args.protocols for stream in (False, True)]
    tally, steps, memory = Tally(), [], {}
    try:  # the server stops (even if registering fails) before the caller removes its folder
        await model.register(backend)
        assert backend._process is not None
        calls = Calls(backend.base_url, NAME, args.max_tokens)
        began = time.monotonic()
        stop_at = began + 60 * args.minutes
        await asyncio.gather(
            *(client_loop(i, calls, kinds[i % len(kinds)], stop_at, tally) for i in range(args.clients)),
            trainer_loop(model, args.train_every, stop_at, tally, steps),
            disconnect_loop(calls, args.disconnect_every, stop_at, tally),
            sample_memory(backend._process.pid, stop_at, tally, memory),
        )
        wall = time.monotonic() - began
        memory["end"] = resident_mb(backend._process.pid)
        final = await steps_at_end(calls)
        await calls.close()
        rows = TokenStore(folder / "art" / "bench" / "models" / NAME / "tokens" / "store.sqlite").count()
    finally:
        await backend.close()
    return summary(args, tally, steps, memory, wall, rows, final)


def summary(
    args: argparse.Namespace,
    tally: Tally,
    steps: list[dict[str, Any]],
    memory: dict[str, float],
    wall: float,
    rows: int,
    final: list[int],
) -> dict[str, Any]:
    kinds = {name: kind.figures() for name, kind in sorted(tally.kinds.items())}
    served = sum(kind["served"] for kind in kinds.values())
    warm, end = memory.get("warm", float("nan")), memory["end"]
    return {
        "clients": args.clients,
        "minutes": args.minutes,
        "prefix_cache_mb": args.prefix_cache_mb,
        "served": served,
        "failed": sum(kind["failed"] for kind in kinds.values()),
        "failures": [f"{n}: {f}" for n, kind in tally.kinds.items() for f in kind.failures][:5],
        "busy_refused": sum(kind["busy_refused"] for kind in kinds.values()),
        "requests_per_s": round(served / wall, 1),
        "by_protocol": kinds,
        "disconnects": tally.disconnects,
        "train_steps": steps,
        "steps_committed": len(tally.committed),
        "train_failed": sum("failed" in step for step in steps),
        "stale_answers": len(tally.stale),
        "stale_examples": tally.stale[:3],
        "committed_never_served": sorted(set(tally.committed) - tally.served_steps - {tally.latest()}),
        "last_step_served_at_end": final == [tally.latest()] * len(final),
        "rss_mb": {key: round(mb, 1) for key, mb in memory.items()},
        "rss_end_vs_warm": round(end / warm - 1, 4),
        "store_rows": rows,
        "store_rows_minus_served": rows - served - len(final),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--train-every", type=float, default=60.0, help="seconds between train calls")
    parser.add_argument("--disconnect-every", type=float, default=3.0, help="seconds between mid-stream hang-ups")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--prefix-cache-mb", type=float, default=32.0, help="the engine's prefix cache budget")
    parser.add_argument("--protocols", type=lambda text: text.split(","), default=list(PROTOCOLS))
    parser.add_argument("--json-out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="art-load-") as folder:
        result = asyncio.run(soak(args, Path(folder)))
    print(json.dumps(result, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""What a Langfuse host that is down costs a rollout: Langfuse off vs Langfuse pointed at a closed port.

Real LangGraph rollouts (a ReAct agent: a tool call, the tool, an answer) against the art-agents
server in a process of its own (the scripted engine on the tiny model: real tokenizer, token store
and routes, answers without generation, so a rollout is short and any overhead shows). A round is
`--groups` x `--group-size` concurrent rollouts followed by `model.log` of their groups, which is
where the reporter exports them; its time divided by the rollouts is the time per rollout. Rounds
alternate between a model with Langfuse off and one reporting to the dead host: off, down, off, ...
Printed: each side's median and spread (min-max) per rollout and the part spent in `model.log`,
the ratio of medians (goal: under 1.05x) and the median of the ratios of adjacent rounds, and how
long closing the backend (the reporter's bounded flush) took with the host down.

    python benchmarks/langfuse_overhead.py [--rounds 10] [--groups 4] [--group-size 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ANSWER = "The answer is 5."
# the server with the test-only scripted engine enabled, as the tests run it
SERVE = """
import sys, uvicorn
from art_agents.server.http.app import create_app
uvicorn.run(create_app(sys.argv[1], test_engines=True), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def wait_healthy(url: str, server: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient() as http:
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with code {server.returncode}")
            try:
                if (await http.get(f"{url}/health", timeout=2)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the server did not start")


async def measure(url: str, model_path: Path, rounds: int, groups: int, group_size: int) -> dict[str, Any]:
    from langchain.agents import create_agent

    from art_agents import ModelConfig, RemoteBackend, TrainableModel, TrajectoryGroup, gather_trajectory_groups
    from art_agents.integrations.langgraph import wrap

    call = json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}})
    config = ModelConfig(
        engine="scripted", scripted_responses=[f"<tool_call>\n{call}\n</tool_call>", ANSWER], default_max_tokens=64
    )
    backend = RemoteBackend(url)
    sides = {
        side: TrainableModel(name=side, project="bench", base_model=str(model_path), config=config, report_to=report_to)
        for side, report_to in (("off", ["none"]), ("down", ["langfuse"]))
    }
    agents = {}
    for side, model in sides.items():
        await model.register(backend)
        agents[side] = wrap(create_agent(model.chat_model(), [add], system_prompt="Use the tools."), model=model)

    async def one_round(side: str) -> tuple[float, float]:
        """(seconds per rollout for the round, of which in `model.log`)."""
        started = time.perf_counter()
        batch = [
            TrajectoryGroup(
                agents[side].rollout({"messages": [("user", f"Task {g}: what is 2 + 3?")]}, lambda out, t: len(t.turns))
                for _ in range(group_size)
            )
            for g in range(groups)
        ]
        finished = await gather_trajectory_groups(batch, pbar_desc=None)
        log_started = time.perf_counter()
        await sides[side].log(finished, split="val")
        ended = time.perf_counter()
        return (ended - started) / (groups * group_size), (ended - log_started) / (groups * group_size)

    for side in sides:  # warm-up: first requests, imports, the reporter's client
        await one_round(side)
    per_rollout: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side in sides:
            per_rollout[side].append(await one_round(side))
    started = time.perf_counter()
    await backend.close()  # flushes the reporter: bounded by LANGFUSE_TIMEOUT with the host down
    return {"per_rollout": per_rollout, "close_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per side")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    dead_port = free_port()  # nothing listens there: the host is down
    os.environ.update(
        LANGFUSE_PUBLIC_KEY="pk-lf-benchmark",
        LANGFUSE_SECRET_KEY="sk-lf-benchmark",
        LANGFUSE_BASE_URL=f"http://127.0.0.1:{dead_port}",
    )
    with tempfile.TemporaryDirectory(prefix="art-langfuse-") as folder:
        from art_agents.server.ops.tiny_model import build_tiny_model

        model_path = build_tiny_model(Path(folder) / "tiny")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with open(Path(folder) / "server.log", "wb") as log:
            server = subprocess.Popen(
                [sys.executable, "-c", SERVE, str(Path(folder) / "art"), str(port)], stdout=log, stderr=log
            )
        try:
            asyncio.run(wait_healthy(url, server))
            figures = asyncio.run(measure(url, model_path, args.rounds, args.groups, args.group_size))
        finally:
            server.terminate()
            server.wait(timeout=30)  # stopped before its folder is removed
    rollouts = args.groups * args.group_size
    print(
        f"{args.rounds} rounds per side, interleaved, of {args.groups} x {args.group_size} = {rollouts} concurrent "
        f"LangGraph rollouts + model.log; Langfuse down = LANGFUSE_BASE_URL at closed port {dead_port}"
    )
    medians = {}
    for side, label in (("off", "Langfuse off "), ("down", "Langfuse down")):
        times = [total * 1000 for total, _ in figures["per_rollout"][side]]
        logs = [log * 1000 for _, log in figures["per_rollout"][side]]
        medians[side] = statistics.median(times)
        print(
            f"{label}: median {medians[side]:.2f} ms per rollout (spread {min(times):.2f}-{max(times):.2f}), "
            f"of which model.log {statistics.median(logs):.2f}"
        )
    print(f"ratio of medians down/off: {medians['down'] / medians['off']:.3f}x (goal < 1.05x)")
    pairs = [
        d / o for (d, _), (o, _) in zip(figures["per_rollout"]["down"], figures["per_rollout"]["off"], strict=True)
    ]
    print(f"median of the per-round ratios down/off: {statistics.median(pairs):.3f}x")
    print(f"closing the backend with the host down (the reporter's bounded flush): {figures['close_s']:.2f} s")


if __name__ == "__main__":
    main()

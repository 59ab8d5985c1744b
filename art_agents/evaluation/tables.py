"""An evaluation's tables as rows of text: per model and per pair. `art-agents eval` and `art-agents report` print
them; the report page writes them as HTML."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from art_agents.evaluation.comparison import PairComparison
from art_agents.evaluation.files import EvalSummary

if TYPE_CHECKING:
    from rich.table import Table


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
    """The per-model table of an evaluation (the report page and `art-agents report` print the same). Headers break
    where a terminal table may wrap them, so it fits 80 columns."""
    head = [
        "model", "scenarios\nrun/failed", "rollouts\nfailed", "mean\nreward", "95% CI", "tokens\nin/out",
        "latency\ns", "cost\nUSD",
    ]  # fmt: skip
    rows = [
        [
            m.model,
            f"{m.scenarios}/{m.failed_scenarios}",
            str(m.failed_rollouts),
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
    """The per-pair table: model minus the one before it ("vs"), its paired bootstrap interval, wins/losses/ties."""
    judged = any(c.judged is not None for c in summary.comparisons)
    head = ["model", "vs", "paired", "mean\ndiff.", "95% CI", "win\nrate", "W/L/T", "failed\nmodel/vs"]
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
            *([_judged(c)] if judged else []),
        ]
        for c in summary.comparisons
    ]
    return [*head, *(["judged\nwin rate\nW/L/T"] if judged else [])], rows


def _judged(comparison: PairComparison) -> str:
    """The pairwise judge's win rate and wins/losses/ties, for the pairs it judged (those against the first model)."""
    j = comparison.judged
    return "-" if j is None else f"{format_value(j.win_rate)}\n{j.wins}/{j.losses}/{j.ties}"


def eval_tables(summary: EvalSummary) -> list[Table]:
    """An evaluation's models, then its pairs, as terminal tables: model names are never cut (other cells wrap
    instead), so `quickstart@20` shows whole at 80 columns."""
    from rich import box
    from rich.table import Table

    tables = []
    for kind, (head, rows), names in (("models", eval_model_rows(summary), 1), ("pairs", eval_pair_rows(summary), 2)):
        if not rows:
            continue
        table = Table(title=f"evaluation {summary.name}: {kind}", box=box.SIMPLE_HEAD, padding=0, show_edge=False)
        for i, column in enumerate(head):
            if i < names:
                table.add_column(column, no_wrap=True, min_width=max(len(row[i]) for row in rows))
            else:
                table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*row)
        tables.append(table)
    return tables


def eval_text(summary: EvalSummary) -> str:
    """The tables as text at the terminal's width: what `art-agents eval` prints and what an `autorl` or `mcp-rl`
    run ends with, so the two can be set side by side."""
    import io
    import shutil

    from rich.console import Console

    console = Console(file=io.StringIO(), width=shutil.get_terminal_size().columns, color_system=None)
    for table in eval_tables(summary):
        console.print(table)
    return console.file.getvalue().rstrip("\n")  # type: ignore[attr-defined]

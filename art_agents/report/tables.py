"""The tables of the report page: metric values, an evaluation's models and pairs, the training history.

`art-agents report` and `art-agents eval` print the same evaluation rows in the terminal (`eval_model_rows`,
`eval_pair_rows`); the page (`art_agents.report.page`) writes them as HTML.
"""

from __future__ import annotations

import html
import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from art_agents.evaluation.files import EvalSummary

Row = dict[str, Any]


def format_value(value: Any) -> str:
    """A metric as a short string: 4 significant digits for floats, '-' for none."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


def escape(value: Any) -> str:
    """Text made safe to put in HTML."""
    return html.escape(str(value))


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


def interval(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"[{low:.3g}, {high:.3g}]"


def html_table(head: list[str], rows: list[list[str]]) -> str:
    if not rows:
        return ""
    header = "".join(f'<th class="{"l" if i < 2 else ""}">{escape(h)}</th>' for i, h in enumerate(head))
    body = "".join(
        "<tr>" + "".join(f'<td class="{"l" if i < 2 else ""}">{escape(v)}</td>' for i, v in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f'<div class="scroll"><table class="eval"><tr>{header}</tr>{body}</table></div>'


# ---- history table


def history_table(rows: list[Row]) -> str:
    """Every row, train and evaluation, with every metric any row has (first-seen order) as a column."""
    if not rows:
        return "<p class='note'>history.jsonl has no rows yet.</p>"
    names = list(dict.fromkeys(name for row in rows for name in row.get("metrics", {})))
    head = "".join(f"<th>{escape(name)}</th>" for name in ["step", "split", "time", *names])
    body = []
    for row in rows:
        when = row.get("time")
        cells = [
            format_value(row.get("step")),
            row.get("split", "train"),
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else "-",
            *(format_value(row.get("metrics", {}).get(name)) for name in names),
        ]
        body.append("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>")
    table = f'<div class="scroll"><table id="history-table"><tr>{head}</tr>\n' + "\n".join(body) + "</table></div>"
    configs = [row for row in rows if row.get("config")]
    if configs:
        last = configs[-1]
        table += (
            f"<details><summary>training config of step {escape(last.get('step'))}</summary>"
            f"<pre>{escape(json.dumps(last['config'], indent=2))}</pre></details>"
        )
    return table

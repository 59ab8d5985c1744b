"""The tables of the report page: HTML tables, and the training history.

An evaluation's rows come from `art_agents.evaluation.tables`, which `art-agents eval` prints too.
"""

from __future__ import annotations

import html
import json
import time
from typing import Any

from art_agents.evaluation.tables import eval_model_rows, eval_pair_rows, format_value, interval

__all__ = [
    "Row",
    "escape",
    "eval_model_rows",
    "eval_pair_rows",
    "format_value",
    "history_table",
    "html_table",
    "interval",
]

Row = dict[str, Any]


def escape(value: Any) -> str:
    """Text made safe to put in HTML."""
    return html.escape(str(value))


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

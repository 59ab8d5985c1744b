"""The `art-agents report` page: a model's training charts, its history and its trajectories in one HTML file.

The file is self-contained (charts as base64 PNGs, inline CSS, no script), so it opens from disk, travels
as an attachment and stays readable next to an archived run, with no server and no network. Everything
a trajectory holds is model or tool text, so all of it is escaped. Its tables (evaluations, history) are built
in `art_agents.report.tables`.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_agents.atomic import write_text_atomic
from art_agents.evaluation.charts import draw_evaluated_steps, draw_summary
from art_agents.extras import require_extra
from art_agents.jsonl import read_groups, read_history
from art_agents.messages import ChatMessage
from art_agents.report.tables import Row, eval_model_rows, eval_pair_rows, format_value, history_table, html_table
from art_agents.report.tables import escape as _e
from art_agents.trajectory import RolloutException, ToolCallRecord, Trajectory, TrajectoryGroup, Turn

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from art_agents.evaluation.files import EvalSummary

Points = tuple[list[float], list[float]]

KL_TITLES = {"kl": "KL to the reference model (kl)", "kl_sampler": "KL to the sampling policy (kl_sampler)"}
RULER_PREFIX = "RULER ("

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1500px;padding:1rem 1.5rem;color:#1d1d1f}
h1{font-size:1.5rem;margin:.2rem 0}h2{border-bottom:1px solid #ddd;margin-top:2rem}h3{margin:1.2rem 0 .4rem}
h5{margin:.7rem 0 .2rem;font-size:.8rem;text-transform:uppercase;color:#666}
nav a{margin-right:1rem}.muted,.note{color:#666}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:1rem}
.charts figure{margin:0}.charts img{width:100%;height:auto;border:1px solid #eee}
.scroll{overflow-x:auto}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #e3e3e3;padding:2px 6px;text-align:right;white-space:nowrap}th{background:#f5f5f7;position:sticky;top:0}
td.l,th.l{text-align:left;white-space:normal}
details.step{border:1px solid #ddd;border-radius:6px;margin:.5rem 0;padding:.3rem .6rem}
details.step>summary{font-weight:600;cursor:pointer}
.group{margin:.8rem 0;padding-top:.4rem;border-top:1px dashed #ccc}.group-head{font-size:12px;color:#555;margin-bottom:.3rem}
.trajectories{display:grid;grid-auto-flow:column;grid-auto-columns:minmax(20rem,1fr);gap:.5rem;overflow-x:auto;align-items:start}
details.trajectory{border:1px solid #cfd8e3;border-radius:6px;padding:.3rem .5rem;background:#fafcff;min-width:0}
details.trajectory.failed{border-color:#e0a0a0;background:#fff7f7}
details.trajectory>summary{cursor:pointer;font-size:13px}
.preview{color:#666;font-weight:normal}.bad{color:#b00020;font-weight:600}
.msg{border-left:3px solid #ccc;margin:.35rem 0;padding:.1rem .4rem}
.msg.system,.msg.developer{border-color:#999}.msg.user{border-color:#3b82f6}.msg.assistant{border-color:#16a34a}
.msg.tool{border-color:#d97706}.role{font-weight:600}.turn{font-size:11px;color:#555}
pre{white-space:pre-wrap;word-break:break-word;margin:.2rem 0;font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}
.call{font:12px ui-monospace,Menlo,Consolas,monospace;background:#f1f5f9;padding:.1rem .3rem;margin:.1rem 0}
.ruler{background:#fff8e1;padding:.2rem .4rem;border-radius:4px}
"""


def write_report(model_dir: Path, out: Path | None = None) -> Path:
    """Write the model's report page (default `<model_dir>/report.html`) atomically; returns its path."""
    model_dir = Path(model_dir)
    from art_agents.evaluation.files import read_summaries

    rows = sorted(read_history(model_dir), key=lambda row: row.get("step", 0))
    summaries = read_summaries(model_dir)
    title = f"{model_dir.parent.parent.name}/{model_dir.name}"
    body = [
        _header(model_dir, title, rows),
        '<nav><a href="#charts">charts</a><a href="#evaluations">evaluations</a><a href="#history">history</a>'
        '<a href="#trajectories">trajectories</a></nav>',
        '<h2 id="charts">Charts</h2>',
        _charts(rows, lambda ax: draw_evaluated_steps(ax, summaries, model_dir.name)),
        '<h2 id="evaluations">Evaluations</h2>',
        _evaluations(summaries),
        '<h2 id="history">History</h2>',
        history_table(rows),
        '<h2 id="trajectories">Trajectories</h2>',
        _trajectories(model_dir / "trajectories"),
    ]
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{_e(title)} report</title><style>{CSS}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
    return write_text_atomic(out or model_dir / "report.html", page)


def _header(model_dir: Path, title: str, rows: list[Row]) -> str:
    try:
        base_model = json.loads((model_dir / "model.json").read_text(encoding="utf-8")).get("base_model")
    except (OSError, ValueError, AttributeError):
        base_model = None
    facts = [
        f"folder {model_dir}",
        f"base model {base_model}" if base_model else None,
        f"latest step {max(row.get('step', 0) for row in rows)}" if rows else "no history yet",
        f"written {time.strftime('%Y-%m-%d %H:%M:%S')}",
    ]
    return f"<h1>{_e(title)}</h1>\n<p class='muted'>{_e(' · '.join(f for f in facts if f))}</p>"


# ---- charts


def _is_eval(row: Row) -> bool:
    """Evaluation rows (`model.log`) name their split and prefix their metrics with it; train rows do neither."""
    return row.get("split") not in (None, "train")


def _points(rows: list[Row], name: str) -> Points:
    """(steps, values) of the rows that have metric `name` as a number."""
    pairs = [
        (row.get("step", 0), value)
        for row in rows
        if isinstance(value := row.get("metrics", {}).get(name), (int, float)) and not isinstance(value, bool)
    ]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _plot(ax: Axes, points: Points, label: str) -> bool:
    if points[0]:
        ax.plot(*points, marker="o", markersize=3, label=label)
    return bool(points[0])


def _draw_reward(ax: Axes, train: list[Row], evals: list[Row], evaluated: Callable[[Axes], bool]) -> bool:
    """Mean reward with a ±std band, the within-group std, each evaluation split's reward as points, and the steps
    `art.evaluate` compared (`evaluated` draws them)."""
    steps, means = _points(train, "reward_mean")
    std = dict(zip(*_points(train, "reward_std"), strict=True))
    drawn = _plot(ax, (steps, means), "reward_mean")
    band = [(s, m, std[s]) for s, m in zip(steps, means, strict=True) if s in std]
    if band:
        ax.fill_between(
            [s for s, _, _ in band],
            [m - d for _, m, d in band],
            [m + d for _, m, d in band],
            alpha=0.2,
            label="± reward_std",
        )
    drawn |= _plot(ax, _points(train, "reward_std_within_group"), "reward_std_within_group")
    for split in sorted({row["split"] for row in evals}):
        rows = [row for row in evals if row["split"] == split]
        eval_steps, rewards = _points(rows, f"{split}/reward")
        spread = dict(zip(*_points(rows, f"{split}/reward_std"), strict=True))
        if eval_steps:
            yerr = [spread.get(s, 0.0) for s in eval_steps]
            ax.errorbar(eval_steps, rewards, yerr=yerr, fmt="s", capsize=3, label=f"{split}/reward")
            drawn = True
    return evaluated(ax) or drawn


def _draw_throughput(ax: Axes, train: list[Row]) -> bool:
    """`tokens_per_s` where the trainer logged it, else tokens_trained / train_s."""
    if _plot(ax, _points(train, "tokens_per_s"), "tokens_per_s"):
        return True
    seconds = dict(zip(*_points(train, "train_s"), strict=True))
    tokens = [(s, n) for s, n in zip(*_points(train, "tokens_trained"), strict=True) if seconds.get(s, 0) > 0]
    return _plot(ax, ([s for s, _ in tokens], [n / seconds[s] for s, n in tokens]), "tokens_trained / train_s")


def _draw_cost(ax: Axes, train: list[Row]) -> bool:
    steps, cost = _points(train, "judge_cost_usd")
    if steps:
        ax.bar(steps, cost, alpha=0.5, label="per step")
        ax.plot(steps, list(itertools.accumulate(cost)), marker="o", markersize=3, label="cumulative")
    return bool(steps)


def _charts(rows: list[Row], evaluated: Callable[[Axes], bool]) -> str:
    """One PNG per chart that some row has data for; a one-line note for each that none has."""
    require_extra("report", purpose="the HTML report page")  # its charts
    train = [row for row in rows if not _is_eval(row)]
    evals = [row for row in rows if _is_eval(row)]
    kl = "kl" if _points(train, "kl")[0] else "kl_sampler"
    charts: list[tuple[str, str, str, str, Callable[[Axes], bool]]] = [
        # (id, title, y label, what a row needs, draw)
        ("reward", "Reward per step", "reward", "reward_mean or <split>/reward", lambda ax: _draw_reward(ax, train, evals, evaluated)),
        ("loss", "GRPO loss", "loss", "loss", lambda ax: _plot(ax, _points(train, "loss"), "loss")),
        ("kl", KL_TITLES[kl], "KL", "kl or kl_sampler", lambda ax: _plot(ax, _points(train, kl), kl)),
        ("entropy", "Entropy of the trained tokens", "nats per token", "entropy",
         lambda ax: _plot(ax, _points(train, "entropy"), "entropy")),
        ("tokens-per-s", "Training throughput", "tokens per second", "tokens_per_s or tokens_trained and train_s",
         lambda ax: _draw_throughput(ax, train)),
        ("judge-cost", "Judge cost", "USD", "judge_cost_usd", lambda ax: _draw_cost(ax, train)),
    ]  # fmt: skip
    parts = []
    for key, title, ylabel, needs, draw in charts:
        png = _render(draw, title, ylabel)
        if png is None:
            parts.append(f'<p class="note" id="chart-{key}-missing">{_e(title)}: no step has {_e(needs)}.</p>')
        else:
            alt = _e(f"{title} by step")
            parts.append(
                f'<figure><img class="chart" id="chart-{key}" alt="{alt}" src="data:image/png;base64,{png}"></figure>'
            )
    return '<div class="charts">' + "\n".join(parts) + "</div>"


def _render(draw: Callable[[Axes], bool], title: str, ylabel: str, xlabel: str = "step") -> str | None:
    """Draw on a fresh figure with the Agg canvas (no pyplot, so a user's interactive backend is left alone)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(6.4, 3.4), dpi=100, layout="constrained")
    ax = figure.subplots()
    if not draw(ax):
        return None
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if xlabel == "step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    buffer = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buffer)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


# ---- evaluations (`art.evaluate`)


def _evaluations(summaries: list[EvalSummary]) -> str:
    """Each evaluation: a bar chart of the models with their intervals, a table per model and one per pair."""
    if not summaries:
        return "<p class='note'>No evaluation under eval/ yet: art.evaluate(...) or art-agents eval writes one.</p>"
    parts = []
    for summary in summaries:
        png = _render(lambda ax, s=summary: draw_summary(ax, s), f"{summary.name}: mean reward", "reward", "model")
        chart = (
            f'<figure><img class="chart" id="chart-eval-{_e(summary.name)}" alt="{_e(summary.name)} by model" '
            f'src="data:image/png;base64,{png}"></figure>'
            if png
            else ""
        )
        head = f"{summary.scenarios} scenarios x {summary.rollouts_per_scenario} rollouts, decoding {summary.decoding}"
        parts.append(
            f'<h3 id="eval-{_e(summary.name)}">{_e(summary.name)}</h3><p class="muted">{_e(head)}</p>'
            f'<div class="charts">{chart}</div>{html_table(*eval_model_rows(summary))}{html_table(*eval_pair_rows(summary))}'
        )
    return "\n".join(parts)


# ---- trajectories


def _file_step(path: Path) -> int:
    return int(path.stem) if path.stem.isdigit() else -1


def _trajectories(root: Path) -> str:
    """Each split (train first), its step files newest first; only the newest of each starts open."""
    splits = (
        sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: (p.name != "train", p.name))
        if root.is_dir()
        else []
    )
    parts = []
    for split in splits:
        files = sorted(split.glob("*.jsonl"), key=_file_step, reverse=True)
        if files:
            parts.append(f"<h3>{_e(split.name)}</h3>")
            parts += [_step_file(path, split.name, is_open=index == 0) for index, path in enumerate(files)]
    return "\n".join(parts) or "<p class='note'>No trajectories saved yet.</p>"


def _step_file(path: Path, split: str, *, is_open: bool) -> str:
    try:
        groups = read_groups(path)
    except (OSError, ValueError) as exc:
        return f"<p class='note bad'>{_e(path)}: {_e(exc)}</p>"
    trajectories = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajectories]
    failures = sum(len(g.exceptions) for g in groups)
    facts = [
        f"{split} step {_file_step(path)}",
        _count(len(groups), "group"),
        _count(len(trajectories), "trajectory", "trajectories"),
        _count(failures, "exception") if failures else None,
        f"mean reward {sum(rewards) / len(rewards):.3f}" if rewards else None,
    ]
    summary = " · ".join(f for f in facts if f)
    groups_html = "\n".join(_group(group, number) for number, group in enumerate(groups, start=1))
    opened = " open" if is_open else ""
    return f'<details class="step" id="{_e(split)}-{_e(path.stem)}"{opened}><summary>{_e(summary)}</summary>\n{groups_html}</details>'


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _group(group: TrajectoryGroup, number: int) -> str:
    head = f"group {number} · rewards " + " ".join(f"{r:.3f}" for r in group.rewards())
    if group.metadata:
        head += f" · {json.dumps(group.metadata, default=str)}"
    cards = "".join(_trajectory(t) for t in group.trajectories)
    return (
        f'<section class="group"><div class="group-head">{_e(head)}</div>'
        f'<div class="trajectories">{cards}</div>{"".join(_exception(x) for x in group.exceptions)}</section>'
    )


def _exception(exc: RolloutException) -> str:
    partial = f"<h5>partial trajectory</h5>{_trajectory(exc.trajectory)}" if exc.trajectory else ""
    return (
        f'<details class="exception"><summary class="bad">{_e(exc.type)}: {_e(exc.message)}</summary>'
        f"<pre>{_e(exc.traceback)}</pre>{partial}</details>"
    )


def _trajectory(trajectory: Trajectory) -> str:
    """A collapsed card: reward, RULER score and the last answer in the summary; everything else inside."""
    ruler_lines = [line for line in trajectory.logs if line.startswith(RULER_PREFIX)]
    other_logs = [line for line in trajectory.logs if not line.startswith(RULER_PREFIX)]
    last = next((m.text() for m in reversed(trajectory.messages) if m.role == "assistant" and m.text()), "")
    ruler = trajectory.metrics.get("ruler_score")
    summary = f"<b>reward {trajectory.reward:.3f}</b>"
    summary += f" · RULER {format_value(ruler)}" if ruler is not None else ""
    summary += " · <span class='bad'>failed</span>" if trajectory.failed else ""
    summary += f" · {_count(len(trajectory.messages), 'message')} <span class='preview'>{_e(last[:90])}</span>"
    turns = {(turn.history, turn.index): turn for turn in trajectory.turns}
    body = [f"<div class='muted'>id {_e(trajectory.id)}</div>"]
    body += [f"<p class='ruler'>{_e(line)}</p>" for line in ruler_lines]
    body.append("<h5>messages</h5>" + _messages(trajectory.messages, turns, 0))
    for number, history in enumerate(trajectory.additional_histories, start=1):
        body.append(f"<h5>additional history {number}</h5>" + _messages(history.messages, turns, number))
    if trajectory.tool_calls:
        body.append("<h5>tools executed</h5>" + _tool_calls(trajectory.tool_calls))
    if trajectory.metrics:
        body.append("<h5>metrics</h5>" + _key_values(trajectory.metrics))
    if trajectory.metadata:
        body.append(f"<h5>metadata</h5><pre>{_e(json.dumps(trajectory.metadata, indent=1, default=str))}</pre>")
    if other_logs:
        body.append(f"<h5>logs</h5><pre>{_e(chr(10).join(other_logs))}</pre>")
    failed = " failed" if trajectory.failed else ""
    return (
        f'<details class="trajectory{failed}" data-trajectory-id="{_e(trajectory.id)}">'
        f"<summary>{summary}</summary>{''.join(body)}</details>"
    )


def _messages(messages: list[ChatMessage], turns: dict[tuple[int, int], Turn], history: int) -> str:
    return "".join(_message(message, turns.get((history, index))) for index, message in enumerate(messages))


def _message(message: ChatMessage, turn: Turn | None) -> str:
    """Role, the turn that produced it (graph node, model@step), text, reasoning and requested tool calls."""
    head = f"<span class='role'>{_e(message.role)}</span>"
    if message.name:
        head += f" {_e(message.name)}"
    if message.tool_call_id:
        head += f" <span class='turn'>answers {_e(message.tool_call_id)}</span>"
    if turn is not None:
        facts = [
            f"node {turn.span}" if turn.span else None,
            turn.model or (f"step {turn.policy_step}" if turn.policy_step is not None else None),
            f"finish {turn.finish_reason}" if turn.finish_reason not in (None, "stop") else None,
            f"{turn.latency_s:.2f} s" if turn.latency_s else None,
        ]
        head += f" <span class='turn'>{_e(' · '.join(f for f in facts if f))}</span>"
    parts = [f"<div>{head}</div>"]
    if message.reasoning_content:
        parts.append(f"<details><summary>reasoning</summary><pre>{_e(message.reasoning_content)}</pre></details>")
    if message.text():
        parts.append(f"<pre>{_e(message.text())}</pre>")
    for call in message.tool_calls or []:
        parts.append(
            f"<div class='call'>→ {_e(call.function.name)}({_e(call.function.arguments)}) <span class='turn'>{_e(call.id)}</span></div>"
        )
    return f'<div class="msg {_e(message.role)}">{"".join(parts)}</div>'


def _tool_calls(calls: list[ToolCallRecord]) -> str:
    rows = []
    for call in calls:
        arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
        outcome = f"<span class='bad'>error: {_e(call.error)}</span>" if call.error else _e(call.result or "")
        rows.append(
            f"<tr><td class='l'>{_e(call.name)}</td><td class='l'><pre>{_e(arguments)}</pre></td>"
            f"<td class='l'><pre>{outcome}</pre></td><td>{call.duration_s:.2f} s</td><td class='l'>{_e(call.span or '')}</td></tr>"
        )
    head = "<tr><th class='l'>tool</th><th class='l'>arguments</th><th class='l'>result</th><th>time</th><th class='l'>span</th></tr>"
    return f"<div class='scroll'><table>{head}{''.join(rows)}</table></div>"


def _key_values(values: dict[str, Any]) -> str:
    rows = "".join(f"<tr><td class='l'>{_e(k)}</td><td>{_e(format_value(v))}</td></tr>" for k, v in values.items())
    return f"<table>{rows}</table>"

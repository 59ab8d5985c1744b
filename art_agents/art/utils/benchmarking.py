"""ART's `art.utils.benchmarking`: the names of an ART notebook's benchmarking cells, as thin adaptors.

`load_trajectories` reads what this package writes (training and `model.log` trajectories, and `art.evaluate`'s
files) into ART's row shape, one dict per trajectory: model, split, step, reward, group_number, messages, logs,
`metric_*` and `metadata_*`, and one column ART lacks, `sampled_step`. It is a list of dicts, not a polars DataFrame
(`polars.DataFrame(rows)` makes one). `split` is the trajectories' folder (`train`, `model.log`'s split) or the
evaluation's name (`heldout`). `step` is the step a row is filed under: a training row under the checkpoint its
update made (ART files it under the step that sampled it), so `sampled_step` says which checkpoint sampled each row
(its turns' policy step). A step of ours that `art.evaluate` ran is filed under its model at that step; any other
evaluated model at step 0 (its `sampled_step` is None).

The charts draw with `art_agents.evaluation.charts` and return a matplotlib Figure, as ART's do, each row at the step
that sampled it, and one split per model, as ART's `BenchmarkModelKey(name, display_name, split)` picks: a model
entry is a name, `(name, shown)`, `(name, shown, split)` or such a key; without a split, a model's evaluation rows
(every split but `train`) where it has any, else its training rows. The comparison bar is each model's last step
with its 95% bootstrap interval (ART stacks first and last step instead).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_agents.evaluation.comparison import mean_ci
from art_agents.evaluation.files import EVAL_FOLDER, read_runs
from art_agents.extras import require_extra
from art_agents.jsonl import read_groups
from art_agents.trajectory import Trajectory

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Row = dict[str, Any]
# a model, (model, name shown) or (model, name shown, split), or ART's BenchmarkModelKey (name, display_name, split)
ModelKey = str | tuple[str, str] | tuple[str, str, str] | Any
_STEP_FILE = re.compile(r"^(?P<name>.+)@(?P<step>\d+)$")
TRAIN_SPLIT = "train"


async def load_trajectories(
    project_name: str, models: list[str] | None = None, debug: bool = False, art_path: str | None = None
) -> list[Row]:
    """Every saved trajectory of the project's models (all of them, or `models`), one row each."""
    root = Path(art_path or ".art") / project_name / "models"
    rows: list[Row] = []
    groups = 0
    for model_dir in sorted(p for p in root.glob("*") if p.is_dir()):
        for path in sorted((model_dir / "trajectories").glob("*/*.jsonl")):
            for group in read_groups(path):
                groups += 1
                split, step = path.parent.name, int(path.stem)
                rows += [
                    _row(model_dir.name, split, step, _sampled_step(t, split, step), t, groups)
                    for t in group.trajectories
                ]
        for path in sorted((model_dir / EVAL_FOLDER).glob("*/*.jsonl")):
            for run in read_runs(path).values():
                groups += 1
                for trajectory in run.trajectories:
                    label = str(trajectory.metadata.get("evaluated_model", path.stem))
                    step = _STEP_FILE.match(label)
                    name, at = (step["name"], int(step["step"])) if step else (label, 0)
                    rows.append(_row(name, path.parent.name, at, at if step else None, trajectory, groups))
        if debug:
            print(f"{model_dir.name}: {len(rows)} trajectories so far")
    return [row for row in rows if models is None or row["model"] in models]


def _sampled_step(trajectory: Trajectory, split: str, step: int) -> int:
    """The checkpoint that sampled a saved trajectory: its turns' policy step; without one, the step before a training
    file's (its update made the checkpoint it is filed under), else the file's step."""
    steps = [turn.policy_step for turn in trajectory.turns if turn.policy_step is not None]
    return min(steps) if steps else step - 1 if split == TRAIN_SPLIT else step


def _row(model: str, split: str, step: int, sampled: int | None, trajectory: Trajectory, group: int) -> Row:
    return {
        "model": model,
        "split": split,
        "step": step,
        "sampled_step": sampled,
        "reward": trajectory.reward,
        "group_number": group,
        "messages": [m.model_dump(exclude_none=True) for m in trajectory.messages],
        "logs": list(trajectory.logs),
        **{f"metric_{k}": float(v) for k, v in trajectory.metrics.items()},
        **{f"metadata_{k}": str(v) for k, v in trajectory.metadata.items()},
    }


def _values(
    df: Sequence[Row], metric_name: str, models: Sequence[ModelKey] | None
) -> dict[str, dict[int, list[float]]]:
    """{shown name: {sampled step: values}} of the metric (`reward`, a `metric_*` column or its bare name), in model
    order, from one split per model (the key's, else its evaluations where it has any, else its training rows)."""
    column = metric_name if any(metric_name in row for row in df) else f"metric_{metric_name}"
    keys = [_key(k) for k in models] if models else [(m, m, None) for m in dict.fromkeys(r["model"] for r in df)]
    values: dict[str, dict[int, list[float]]] = {shown: {} for _, shown, _ in keys}
    for name, shown, split in keys:
        rows = [row for row in df if row["model"] == name and row.get(column) is not None]
        evaluated = any(row["split"] != TRAIN_SPLIT for row in rows)
        splits = {split} if split else {r["split"] for r in rows if (r["split"] != TRAIN_SPLIT) == evaluated}
        for row in (row for row in rows if row["split"] in splits):
            at = row["step"] if row.get("sampled_step") is None else row["sampled_step"]
            values[shown].setdefault(at, []).append(float(row[column]))
    if not any(values.values()):
        raise ValueError(f"no row has {column!r} for the models (and splits) asked for")
    return {shown: steps for shown, steps in values.items() if steps}


def _key(entry: ModelKey) -> tuple[str, str, str | None]:
    """(model, name shown, split or None) of a `models=` entry."""
    if isinstance(entry, str):
        return entry, entry, None
    if isinstance(entry, tuple):
        name, shown, *split = entry
        return name, shown, split[0] if split else None
    return entry.name, getattr(entry, "display_name", None) or entry.name, getattr(entry, "split", None)


def percentage_comparison_bar_chart(
    df: Sequence[Row],
    metric_name: str,
    models: Sequence[ModelKey] | None = None,
    title: str | None = None,
    y_label: str | None = None,
    perfect_score: float | None = None,
) -> Figure:
    """Each model's metric at its last step, with the 95% bootstrap interval over its rows."""
    from art_agents.evaluation.charts import draw_bars, figure

    require_extra("report", purpose="benchmarking charts")
    last = {shown: steps[max(steps)] for shown, steps in _values(df, metric_name, models).items()}
    intervals = {shown: mean_ci(v) for shown, v in last.items()}
    fig, ax = figure()
    labels = list(last)
    means = [intervals[s][0] for s in labels]
    draw_bars(ax, labels, means, [(intervals[s][1], intervals[s][2]) for s in labels], perfect_score)
    ax.set(title=title or metric_name, ylabel=y_label or "")
    return fig


def training_progress_chart(
    df: Sequence[Row],
    metric_name: str,
    models: Sequence[ModelKey] | None = None,
    title: str | None = None,
    x_label: str | None = None,
    y_label: str | None = None,
    perfect_score: float | None = None,
    legend_loc: str | None = "lower right",
) -> Figure:
    """The metric's mean per step, a line per model; a model evaluated once is a dashed level line."""
    from art_agents.evaluation.charts import figure

    require_extra("report", purpose="benchmarking charts")
    values = _values(df, metric_name, models)
    trained = [s for step in values.values() for s in step]
    fig, ax = figure()
    for shown, steps in values.items():
        xs = sorted(steps)
        means = [statistics.fmean(steps[x]) for x in xs]
        if len(xs) > 1:
            ax.plot(xs, means, marker="o", markersize=3, label=shown)
        else:
            ax.axhline(means[0], linestyle="--", linewidth=1, label=shown)
    if perfect_score is not None:
        ax.axhline(perfect_score, color="dimgray", linewidth=1, label="perfect score")
    ax.set(title=title or metric_name, xlabel=x_label or "step", ylabel=y_label or metric_name)
    ax.set_xlim(min(trained, default=0), max(trained, default=1) or 1)
    ax.legend(loc=legend_loc, fontsize="small")
    return fig


def generate_charts(
    df: Sequence[Row], output_dir: str | Path, metric_name: str = "reward", models: Sequence[ModelKey] | None = None
) -> list[Path]:
    """Both charts of `metric_name` saved as PNGs in `output_dir`; returns their paths."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind, chart in (("comparison", percentage_comparison_bar_chart), ("progress", training_progress_chart)):
        path = folder / f"{metric_name}_{kind}.png"
        chart(df, metric_name, models).savefig(path)
        paths.append(path)
    return paths


__all__ = ["generate_charts", "load_trajectories", "percentage_comparison_bar_chart", "training_progress_chart"]

"""Charts of evaluations (matplotlib, the `report` extra): models side by side with their 95% intervals, and
evaluated steps over training. The report page and ART's `art.utils.benchmarking` names draw with these."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from art_agents.evaluation.files import EvalSummary


def draw_bars(
    ax: Axes,
    labels: Sequence[str],
    means: Sequence[float],
    intervals: Sequence[tuple[float, float] | None],
    perfect_score: float | None = None,
) -> bool:
    """One bar per model at its mean, with its interval as an error bar where it has one."""
    if not labels:
        return False
    positions = list(range(len(labels)))
    below = [m - i[0] if i else 0.0 for m, i in zip(means, intervals, strict=True)]
    above = [i[1] - m if i else 0.0 for m, i in zip(means, intervals, strict=True)]
    ax.bar(positions, means, yerr=[below, above], capsize=4, color="#4c78a8", label="mean (95% CI)")
    for x, mean in zip(positions, means, strict=True):
        ax.annotate(f"{mean:.3g}", (x, mean), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
    if perfect_score is not None:
        ax.axhline(perfect_score, color="dimgray", linewidth=1, label="perfect score")
    ax.set_xticks(positions, labels, rotation=20, ha="right", fontsize=8)
    return True


def draw_summary(ax: Axes, summary: EvalSummary) -> bool:
    """An evaluation's models: mean reward over the scenarios each ran, with its bootstrap interval."""
    shown = [m for m in summary.models if m.mean_reward is not None]
    intervals = [(m.ci_low, m.ci_high) if m.ci_low is not None and m.ci_high is not None else None for m in shown]
    return draw_bars(ax, [m.model for m in shown], [m.mean_reward or 0.0 for m in shown], intervals)


def draw_evaluated_steps(ax: Axes, summaries: Sequence[EvalSummary], model_name: str) -> bool:
    """Each evaluated step of `model_name` as a marker with its interval, on the training curve's axes."""
    drawn = False
    for summary in summaries:
        points = [
            m
            for m in summary.models
            if m.step is not None and m.model == f"{model_name}@{m.step}" and m.mean_reward is not None
        ]
        if not points:
            continue
        means = [m.mean_reward or 0.0 for m in points]
        below = [mean - (m.ci_low if m.ci_low is not None else mean) for m, mean in zip(points, means, strict=True)]
        above = [(m.ci_high if m.ci_high is not None else mean) - mean for m, mean in zip(points, means, strict=True)]
        steps = [m.step or 0 for m in points]
        ax.errorbar(steps, means, yerr=[below, above], fmt="D", capsize=3, label=f"eval {summary.name}")
        drawn = True
    return drawn


def figure() -> tuple[Figure, Axes]:
    """A figure on the Agg canvas (no pyplot, so a user's interactive backend is left alone)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()

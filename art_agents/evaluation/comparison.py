"""Comparing two models on the same scenarios: paired differences, their bootstrap interval, win rates.

The one implementation that `art.evaluate`, the learning benchmark and the MCP•RL benchmark share. Hand-written,
as is `paired_t_halfwidth`: `scipy.stats.bootstrap` would need scipy, a dependency of no extra.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

from pydantic import Field

from art_agents.schema import Schema


def paired_ci(
    before: Sequence[float], after: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean paired difference (after - before) and its 95% percentile-bootstrap interval over the pairs."""
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    if not diffs:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(resamples))
    return statistics.fmean(diffs), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def paired_t_halfwidth(before: Sequence[float], after: Sequence[float]) -> float:
    """Half-width of the 95% paired-t interval (normal quantile: n is in the tens or more)."""
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    return 1.96 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")


def mean_ci(values: Sequence[float], *, resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """A mean and its 95% percentile-bootstrap interval (the paired interval against zero)."""
    return paired_ci([0.0] * len(values), values, resamples=resamples, seed=seed)


class JudgedWins(Schema):
    """A judge's side-by-side verdicts on two models' answers to the same scenarios. Where rewards are relative
    (RULER ranks each group on its own), two models' mean rewards are not on one scale; these verdicts are."""

    wins: int
    losses: int
    ties: int
    win_rate: float | None = Field(description="(wins + ties / 2) / scenarios: 0.5 is no better than the baseline.")


class PairComparison(Schema):
    """`model` against `baseline` on the scenarios both ran: how much better, how sure, how often."""

    model: str
    baseline: str
    paired: int = Field(description="Scenarios both models ran; the difference and win rate are over these.")
    model_failed: int = Field(description="Scenarios `model` failed to run (left out of the pairs).")
    baseline_failed: int = Field(description="Scenarios `baseline` failed to run (left out of the pairs).")
    mean_difference: float | None = Field(description="Mean of model - baseline reward per scenario.")
    ci_low: float | None = Field(description="2.5% bound of the paired bootstrap over scenarios.")
    ci_high: float | None = Field(description="97.5% bound of the paired bootstrap over scenarios.")
    wins: int
    losses: int
    ties: int
    win_rate: float | None = Field(description="(wins + ties / 2) / paired: 0.5 is no better than the baseline.")
    judged: JudgedWins | None = Field(None, description="A pairwise judge's verdicts (runs scored by RULER).")


def compare_pair(
    model: str,
    baseline: str,
    rewards: dict[str, float | None],
    baseline_rewards: dict[str, float | None],
    *,
    resamples: int = 10_000,
    seed: int = 0,
) -> PairComparison:
    """Compare two models' mean rewards per scenario id; None marks a scenario that model failed to run."""
    ids = [i for i in rewards if i in baseline_rewards]
    pairs = [(rewards[i], baseline_rewards[i]) for i in ids]
    both = [(m, b) for m, b in pairs if m is not None and b is not None]
    mean, low, high = paired_ci([b for _, b in both], [m for m, _ in both], resamples=resamples, seed=seed)
    wins, losses = sum(m > b for m, b in both), sum(m < b for m, b in both)
    ties = len(both) - wins - losses
    return PairComparison(
        model=model,
        baseline=baseline,
        paired=len(both),
        model_failed=sum(m is None for m, _ in pairs),
        baseline_failed=sum(b is None for _, b in pairs),
        mean_difference=None if not both else mean,
        ci_low=None if not both else low,
        ci_high=None if not both else high,
        wins=wins,
        losses=losses,
        ties=ties,
        win_rate=(wins + ties / 2) / len(both) if both else None,
    )

"""Interleaved timing for the benchmarks: every side runs once per round (A, B, A, B, ...), and each
figure is a median with its spread, so that load changes on a shared machine hit all sides alike and a
figure from a fresh clone can be told apart from noise.

Benchmarks are run as scripts (`python benchmarks/x.py`) and import this as `from timing import ...`
after putting their own folder on `sys.path`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Summary:
    """Median and range (min-max) of repeated measurements; `values` keeps them in round order for `ratio`."""

    median: float
    low: float
    high: float
    runs: int
    values: tuple[float, ...] = field(repr=False)

    @classmethod
    def of(cls, values: list[float] | tuple[float, ...]) -> Summary:
        if not values:
            raise ValueError("no measurements to summarise")
        return cls(statistics.median(values), min(values), max(values), len(values), tuple(values))

    def scaled(self, factor: float) -> Summary:
        """The same figures times `factor` (seconds per call -> ms per token, say)."""
        return Summary.of([v * factor for v in self.values])

    def format(self, unit: str = "ms", scale: float = 1000.0, digits: int = 1) -> str:
        """`"12.3 ms (11.9-13.0, 5 runs)"` for seconds; `format("x", 1, 2)` for a ratio."""
        m, lo, hi = (f"{v * scale:.{digits}f}" for v in (self.median, self.low, self.high))
        space = "" if unit == "x" else " "
        return f"{m}{space}{unit} ({lo}-{hi}, {self.runs} runs)"

    def __str__(self) -> str:
        return self.format()


def interleaved(sides: dict[str, Callable[[], float | None]], rounds: int, warmup: int = 1) -> dict[str, Summary]:
    """Run every side once per round, in order, after `warmup` unmeasured rounds; each side's seconds.

    A side returns the seconds it measured itself (to leave its set-up out) or None to be timed by
    wall clock.
    """
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    raw: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(warmup + rounds):
        for name, side in sides.items():
            started = time.perf_counter()
            measured = side()
            elapsed = time.perf_counter() - started if measured is None else measured
            if r >= warmup:
                raw[name].append(elapsed)
    return {name: Summary.of(values) for name, values in raw.items()}


def ratio(numerator: Summary, denominator: Summary) -> Summary:
    """Median and range of the per-round ratios: paired, so a slow round slows both sides of its ratio."""
    if numerator.runs != denominator.runs:
        raise ValueError(f"{numerator.runs} vs {denominator.runs} rounds: ratios need paired rounds")
    return Summary.of([a / b for a, b in zip(numerator.values, denominator.values, strict=True)])

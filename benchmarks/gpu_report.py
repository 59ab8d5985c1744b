"""benchmarks/gpu.py's results: rows of figures per round, the table, the time budget and the log."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

STARTED = time.monotonic()  # imported first by gpu.py: the budget counts imports too


# --------------------------------------------------------------------------------------------- results
@dataclass
class Row:
    section: str
    name: str
    values: list[float] = field(default_factory=list)  # tokens/s per round (or seconds, for latencies)
    unit: str = "tok/s"
    note: str = ""
    peak_gib: float = 0.0  # the most GPU memory allocated during any of its calls

    def full_note(self) -> str:
        peak = f"peak {self.peak_gib:.1f} GiB allocated" if self.peak_gib else ""
        return "; ".join(n for n in (self.note, peak) if n)

    def cells(self) -> list[str]:
        if not self.values:
            return [self.section, self.name, "-", "-", "0", self.full_note() or "not measured"]
        digits = 0 if self.unit == "tok/s" else 1
        scale = 1000.0 if self.unit == "ms" else 1.0
        med, low, high = (f"{v * scale:,.{digits}f}" for v in median_range(self.values))
        return [self.section, self.name, f"{med} {self.unit}", f"{low}-{high}", str(len(self.values)), self.full_note()]


def median_range(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


@dataclass
class Report:
    header: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    printed: bool = False
    failures: int = 0

    def failed(self, what: str, exc: BaseException) -> None:
        """Note a failed part and go on with the others (a one-shot run should bring back all it can)."""
        import traceback

        self.failures += 1
        self.notes.append(f"FAILED {what}: {type(exc).__name__}: {str(exc)[:400]}")
        log(f"{what} failed:\n{traceback.format_exc()}")

    def row(self, section: str, name: str, unit: str = "tok/s", note: str = "") -> Row:
        row = Row(section, name, unit=unit, note=note)
        self.rows.append(row)
        return row

    def print(self, ending: str) -> None:
        if self.printed:
            return
        self.printed = True
        titles = ["section", "row", "median", "min-max", "n", "note"]
        table = [titles, *(r.cells() for r in self.rows)]
        widths = [max(len(line[i]) for line in table) for i in range(len(titles) - 1)]
        out = ["", "=" * 30 + " benchmarks/gpu.py " + "=" * 30, *self.header, ""]
        for i, line in enumerate(table):
            out.append("  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1])
            if i == 0:
                out.append("  ".join("-" * w for w in widths) + "  ----")
        out += ["", *self.notes, ending]
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()


REPORT = Report()


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = STARTED + seconds
        self.stopped: str | None = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, seconds: float, what: str) -> bool:
        """Whether `seconds` more (with a margin) still fit; the first refusal is noted."""
        if self.left() > seconds * 1.25 + 5:
            return True
        self.stopped = f"stopped by --budget-seconds before {what} ({self.left():.0f} s left)"
        REPORT.notes.append(self.stopped)
        log(self.stopped)
        return False


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


def interleaved(
    sides: list[tuple[Row, Callable[[], float]]], rounds: int, budget: Budget, label: str, device: str, warmup: int = 1
) -> None:
    """Each side once per round (a warm-up round first); a side returns its figure (tok/s or seconds)."""
    import torch

    cuda = device.startswith("cuda")
    last: dict[int, float] = {}
    for r in range(warmup + rounds):
        estimate = sum(last.values()) if last else 0.0
        if r > 0 and not budget.allows(estimate, f"{label} round {r}"):
            return
        for i, (row, side) in enumerate(sides):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            started = time.monotonic()
            value = side()
            last[i] = time.monotonic() - started
            if cuda:
                row.peak_gib = max(row.peak_gib, torch.cuda.max_memory_allocated() / 2**30)
            if r >= warmup:
                row.values.append(value)
        log(f"{label} round {r}{' (warm-up)' if r < warmup else ''}: {_round_line(sides, r >= warmup)}")


def _round_line(sides: list[tuple[Row, Callable[[], float]]], measured: bool) -> str:
    if not measured:
        return "done"
    return ", ".join(f"{row.name.split(' ')[0]}={row.values[-1]:,.3g}" for row, _ in sides if row.values)

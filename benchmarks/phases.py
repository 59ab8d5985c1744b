"""Where a learning benchmark's wall time went, phase by phase, so that a reader sees whether a run was spent
loading, evaluating, fine-tuning, rolling out or training (and two runs' figures can be told apart by that).

Benchmarks are run as scripts and import this as `from phases import ...` after putting their folder on `sys.path`.
"""

from __future__ import annotations


def phase_seconds(wall_s: float, phases: dict[str, float]) -> dict[str, float]:
    """The phases in the order given (names such as `base_evaluation`), then `other` (what none of them covers:
    start-up, resets between steps) and `wall`, in seconds rounded to 0.1; phases that took no time are left out."""
    spent = {name: round(seconds, 1) for name, seconds in phases.items() if seconds > 0}
    return spent | {"other": round(max(0.0, wall_s - sum(phases.values())), 1), "wall": round(wall_s, 1)}


def phase_line(seconds: dict[str, float]) -> str:
    """`seconds by phase: load 21.0, base evaluation 12.3, ...; other 0.4; wall 900.1` with each one's share."""
    wall = seconds["wall"] or 1.0
    parts = [
        f"{name.replace('_', ' ')} {value:.1f} ({100 * value / wall:.0f}%)"
        for name, value in seconds.items()
        if name not in ("other", "wall")
    ]
    return f"seconds by phase: {', '.join(parts)}; other {seconds['other']:.1f}; wall {seconds['wall']:.1f}"

"""No test asserts that something took less than a few seconds of wall-clock time: on a machine busy with other work
such a test fails on the machine's speed, not on what the program did. Tests bound CPU seconds (`cpu_clock.py`),
count calls and waits, or give a bound far from both outcomes; speeds are measured in `benchmarks/`."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
WALL_CLOCKS = {"monotonic", "perf_counter", "time"}  # time.<name>(): seconds that a busy machine stretches
GENEROUS_S = 30  # a wall-clock bound at least this far off stands for "never", not for a speed


def reads_the_clock(node: ast.AST, clock_names: set[str]) -> bool:
    return any(
        (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in WALL_CLOCKS
         and isinstance(n.func.value, ast.Name) and n.func.value.id == "time")
        or (isinstance(n, ast.Name) and n.id in clock_names)
        for n in ast.walk(node)
    )  # fmt: skip


def clock_names(function: ast.AST) -> set[str]:
    """Names that hold wall-clock readings or durations: assigned from the clock, or a list appended with one."""
    names: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value and reads_the_clock(node.value, names):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append"
            and isinstance(node.func.value, ast.Name) and any(reads_the_clock(a, names) for a in node.args)
        ):  # fmt: skip
            names.add(node.func.value.id)
    return names


def tight_limits(path: Path) -> list[str]:
    """`assert <clock> < N` (or `N > <clock>`) with N under GENEROUS_S, as file:line."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        names = clock_names(function)
        for check in (n for n in ast.walk(function) if isinstance(n, ast.Assert)):
            for compare in (n for n in ast.walk(check.test) if isinstance(n, ast.Compare)):
                sides = [compare.left, *compare.comparators]
                for left, op, right in zip(sides, compare.ops, sides[1:], strict=False):
                    if isinstance(op, ast.Gt | ast.GtE):
                        left, right = right, left
                    elif not isinstance(op, ast.Lt | ast.LtE):
                        continue
                    bound = right.value if isinstance(right, ast.Constant) else None
                    if isinstance(bound, int | float) and bound < GENEROUS_S and reads_the_clock(left, names):
                        found.append(f"{path.name}:{check.lineno}")
    return found


def test_no_test_bounds_wall_clock_time_tightly() -> None:
    assert [place for path in sorted(TESTS.glob("*.py")) for place in tight_limits(path)] == []

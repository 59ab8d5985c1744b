"""The direction of imports (docs/architecture.md), read from the source with ast: every import counts, lazy and
type-only ones included, so a rule cannot be kept by hiding an import inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {  # source folder -> the package it installs as (pyproject's package-dir)
    "art_agents": "art_agents",
    "integrations": "art_agents.integrations",
    "ruler": "art_agents.ruler",
    "autorl": "art_agents.autorl",
    "server": "art_agents.server",
}
ABOVE_THE_CORE = [FOLDERS[folder] for folder in ("integrations", "ruler", "autorl", "server")]
ART_FACE = "art_agents.art"  # ART's names over the whole toolkit: it may import from every folder
# The one seam from the core upward is art_agents/parts.py: what the core starts of the parts above it (the server
# app for LocalBackend, the CLI's subcommands, reporters, the LangGraph chat model) it names there as strings and
# imports at first use, so no import statement of the core points upward.


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [FOLDERS[folder], *rest]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def within(module: str, *packages: str) -> bool:
    return any(module == package or module.startswith(f"{package}.") for package in packages)


def source_modules() -> dict[str, Path]:
    return {module_name(path): path for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of this package that `path` imports anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    return {module for module in found if module in known and module != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = source_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_source_is_read_whole(graph: dict[str, set[str]]) -> None:
    assert {"art_agents.backends.local", "art_agents.server.engines.protocol", "art_agents.ruler.judge"} <= set(graph)
    assert "art_agents.server.engines.protocol" in graph["art_agents.server.engines.transformers_engine"]


def test_no_module_imports_itself_round_a_circle(graph: dict[str, set[str]]) -> None:
    assert circles(graph) == []


def test_the_core_imports_nothing_from_the_folders_above_it(graph: dict[str, set[str]]) -> None:
    core = {name for name in graph if not within(name, *ABOVE_THE_CORE, ART_FACE)}
    upward = {(module, target) for module in core for target in graph[module] if within(target, *ABOVE_THE_CORE)}
    assert upward == set()


@pytest.mark.parametrize(("part", "other"), [("engines", "training"), ("training", "engines")])
def test_engines_and_training_meet_only_at_the_engine_protocol(
    graph: dict[str, set[str]], part: str, other: str
) -> None:
    allowed = {"art_agents.server.engines.protocol"}
    crossing = {
        (module, target)
        for module, targets in graph.items()
        if within(module, f"art_agents.server.{part}")
        for target in targets
        if within(target, f"art_agents.server.{other}") and target not in allowed
    }
    assert crossing == set()


# The parts inside the server and inside the core, bottom first: a part imports only parts below it (docs/architecture.md).
SERVER_PARTS = ["errors", "host", "models", "storage", "engines", "training", "serving", "formats", "export", "service"]
SERVER_PARTS += ["http", "ops"]
CORE_PARTS = ["evaluation", "report", "backends", "loop", "cli"]  # over the core's flat modules (types, capture, wire)


@pytest.mark.parametrize(("package", "parts"), [("art_agents.server", SERVER_PARTS), ("art_agents", CORE_PARTS)])
def test_no_part_imports_a_part_above_it(graph: dict[str, set[str]], package: str, parts: list[str]) -> None:
    def rank(module: str) -> int | None:
        part = module.removeprefix(f"{package}.").split(".")[0] if module.startswith(f"{package}.") else None
        return parts.index(part) if part in parts else None

    upward = {
        (module, target)
        for module, targets in graph.items()
        for target in targets
        if (low := rank(module)) is not None and (high := rank(target)) is not None and high > low
    }
    assert upward == set()


def with_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Importing `a.b.c` runs `a` and `a.b` first: the graph with those edges, in which a package's face counts."""
    out = {module: set(targets) for module, targets in graph.items()}
    for module, targets in graph.items():
        for target in targets:
            parent = target.rpartition(".")[0]
            while parent and parent in graph:
                if parent != module and not module.startswith(f"{parent}."):
                    out[module].add(parent)
                parent = parent.rpartition(".")[0]
    return out


def test_no_circle_runs_through_a_package_face(graph: dict[str, set[str]]) -> None:
    assert circles(with_packages(graph)) == []


def test_no_module_over_450_lines_or_function_over_80() -> None:
    paths = [*source_modules().values(), *sorted((ROOT / "benchmarks").glob("*.py"))]
    long_modules = [(p.name, n) for p in paths if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450]
    long_functions = [
        (f"{p.relative_to(ROOT)}:{node.name}", node.end_lineno - node.lineno + 1)
        for p in paths
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 80
    ]
    assert (long_modules, long_functions) == ([], [])

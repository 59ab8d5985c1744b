"""The public surface survives a move of modules: every name of `art.__all__`, ART's import paths, and every
import line that README.md and docs/*.md show a user (so a page that still names a moved module fails here)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import art_agents as art

ROOT = Path(__file__).resolve().parents[1]
# ART's module paths (`art.local`, `art.utils.benchmarking`, ...) as they import after renaming `art` to `art_agents`
ART_PATHS = [
    "art_agents.dev",
    "art_agents.local",
    "art_agents.langgraph",
    "art_agents.rewards",
    "art_agents.utils",
    "art_agents.utils.benchmarking",
    "art_agents.utils.sft",
]
# `from art_agents... import a, b` (one line, or parenthesized over several) and `import art_agents...`
IMPORT = re.compile(
    r"^[ \t]*(from art_agents[\w.]* import (?:\([^)]*\)|[^\n]*)|import art_agents[\w.]*(?: as \w+)?)[ \t]*$", re.M
)

# a dotted name the pages write in backticks, such as `art_agents.evaluation.comparison.paired_ci`
DOTTED = re.compile(r"`(art_agents(?:\.[A-Za-z_]\w*)+)`")


def pages() -> list[Path]:
    return sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def doc_imports() -> list[tuple[str, str]]:
    found = []
    for page in pages():
        for line in IMPORT.findall(page.read_text(encoding="utf-8")):
            found.append((page.relative_to(ROOT).as_posix(), " ".join(line.split()).split(" #")[0]))
    return sorted(set(found))


@pytest.mark.parametrize("name", art.__all__)
def test_every_public_name_imports(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from art_agents import {name}", namespace)
    assert namespace[name] is getattr(art, name)


@pytest.mark.parametrize("path", ART_PATHS)
def test_arts_import_paths_import(path: str) -> None:
    assert importlib.import_module(path).__name__ == path


def test_the_pages_show_imports() -> None:
    assert len(doc_imports()) >= 5  # the scan still finds the pages' imports


@pytest.mark.parametrize(("page", "line"), doc_imports(), ids=[f"{page}: {line}" for page, line in doc_imports()])
def test_every_import_the_docs_show_works(page: str, line: str) -> None:
    exec(line, {})


def doc_names() -> list[tuple[str, str]]:
    return sorted(
        {(page.relative_to(ROOT).as_posix(), name) for page in pages() for name in DOTTED.findall(page.read_text())}
    )


@pytest.mark.parametrize(("page", "name"), doc_names(), ids=[f"{page}: {name}" for page, name in doc_names()])
def test_every_module_path_the_docs_name_resolves(page: str, name: str) -> None:
    pkgutil.resolve_name(name)

"""The README's first command installs everything its first hour uses, `art-agents report`'s charts included."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]


def requirements_of(names: list[str]) -> set[str]:
    """The distributions the extras pull in, through `art-agents[...]` references to other extras."""
    found: set[str] = set()
    for name in names:
        for requirement in extras()[name]:
            inner = re.fullmatch(r"art-agents\[(.+)\]", requirement)
            found |= requirements_of(inner.group(1).split(",")) if inner else {re.split(r"[<>=!~;\[ ]", requirement)[0]}
    return found


def test_the_readmes_first_install_draws_the_reports_charts() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = re.search(r"pip install -c constraints\.txt -e '\.\[([a-z,]+)\]'", readme)
    assert first is not None, "the README has no `pip install -c constraints.txt -e '.[...]'` command"
    assert "matplotlib" in requirements_of(first.group(1).split(",")), first.group(0)
    assert "matplotlib" in requirements_of(["report"])  # the extra the report's error message names stays

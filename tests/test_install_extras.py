"""The README's first command installs everything its first hour uses, `art-agents report`'s charts included."""

from __future__ import annotations

import json
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


def test_the_notebooks_extra_opens_them_and_installs_what_they_import() -> None:
    from art_agents.extras import EXTRA_OF_MODULE

    imported: set[str] = set()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                imported |= set(re.findall(r"^\s*(?:from|import) (\w+)", "".join(cell["source"]), re.MULTILINE))
    needed = {EXTRA_OF_MODULE[module] for module in imported if module in EXTRA_OF_MODULE}
    assert needed and requirements_of(sorted(needed)) <= requirements_of(["notebooks"]), needed
    assert {"jupyterlab", "ipywidgets", "mcp-server-time"} <= requirements_of(["notebooks"])  # and mcp_rl's server


def test_all_holds_every_extra_but_vllm_and_dev_all_but_jupyterlab() -> None:
    """`dev` leaves JupyterLab out: CI runs the notebooks with nbclient, and would install 36 packages for nothing."""
    users = sorted(set(extras()) - {"vllm", "docs", "all", "dev"})
    assert requirements_of(["all"]) == requirements_of(users)
    assert requirements_of(["dev"]) >= requirements_of(["all", "docs"]) - {"jupyterlab"}
    assert "jupyterlab" not in requirements_of(["dev"])

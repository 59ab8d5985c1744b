"""The documentation site builds with no warning, and every code block marked `<!-- runnable -->` in it runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = re.compile(r"<!-- runnable -->\s*```python\n(.*?)```", re.DOTALL)


def runnable_blocks() -> list[tuple[str, str]]:
    found = []
    for page in sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")]):
        for n, block in enumerate(RUNNABLE.findall(page.read_text(encoding="utf-8"))):
            found.append((f"{page.relative_to(ROOT)}#{n}", block))
    return found


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "Two commands" in home
    cli = (tmp_path / "site" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "art-agents doctor" in cli and "--model" in cli  # generated from the commands themselves
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    assert "gather_trajectory_groups" in api and "learning_rate" in api  # generated from the docstrings


def test_the_docs_mark_at_least_one_block_runnable() -> None:
    assert runnable_blocks()


@pytest.mark.parametrize(("where", "code"), runnable_blocks(), ids=[w for w, _ in runnable_blocks()])
def test_a_runnable_block_runs(where: str, code: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=os.environ.copy()
    )
    assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr[-3000:]}"

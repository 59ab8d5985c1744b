"""Each example, run without an extra it needs, says so in the commands' one line before it starts anything.

The missing module is made unimportable in the example's own process (a `sitecustomize` that sets
`sys.modules[name] = None`), as in a venv with only the README's `.[server,report]`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_clock import REFUSED_AT_ONCE_CPU_S, run_counting_cpu

from art_agents.extras import install_hint

REPO = Path(__file__).resolve().parent.parent
ENTRIES = {  # each entry script, and one module of each extra it needs
    "examples/tic_tac_toe/train.py": {"torch": "server"},
    "examples/logic_puzzles/train.py": {"transformers": "server"},
    "examples/email_search/train.py": {"mcp": "mcp", "litellm": "ruler", "trl": "server"},
    "examples/email_search/mcp_server.py": {"mcp": "mcp"},
    "examples/langgraph_planner/train.py": {"langchain_core": "langgraph", "langgraph": "langgraph"},
}


def run_without(module: str, script: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    (tmp_path / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    return run_counting_cpu([sys.executable, str(REPO / script), "--tiny"], cwd=tmp_path, env=env, timeout=120)


@pytest.mark.parametrize(
    ("script", "module", "extra"),
    [(script, module, extra) for script, needs in ENTRIES.items() for module, extra in needs.items()],
)
def test_an_example_without_its_extra_names_it_in_one_line(
    script: str, module: str, extra: str, tmp_path: Path
) -> None:
    result, cpu_s = run_without(module, script, tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        f"error: {script} needs the '{extra}' extra (No module named '{module}'): {install_hint(extra)}"
    ]
    assert (
        result.stdout == ""
        and cpu_s < REFUSED_AT_ONCE_CPU_S
        and list(tmp_path.iterdir()) == [tmp_path / "sitecustomize.py"]
    )  # nothing started, nothing written

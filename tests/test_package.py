"""The client core stays light, and the CLI answers."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["torch", "transformers", "litellm", "langchain", "langchain_core", "langgraph", "openai", "peft", "trl"]


def test_import_is_fast_and_pulls_no_heavy_packages() -> None:
    # CPU time of the importing process, so a busy machine does not make the check flaky.

    code = (
        "import sys, time, json; t = time.process_time(); import art_agents; "
        "print(json.dumps({'s': time.process_time() - t, 'mods': sorted(sys.modules)}))"
    )
    best = min(
        (
            json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
            for _ in range(3)
        ),
        key=lambda r: r["s"],
    )
    assert best["s"] < 0.5, f"import art_agents took {best['s']:.2f}s"
    loaded = {m.split(".")[0] for m in best["mods"]}
    assert not loaded & set(HEAVY), f"import art_agents pulled in {sorted(loaded & set(HEAVY))}"


def test_cli_version_and_help() -> None:
    import art_agents

    version = subprocess.run(
        [sys.executable, "-m", "art_agents", "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == f"art-agents {art_agents.__version__}"
    help_text = subprocess.run(
        [sys.executable, "-m", "art_agents", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "report" in help_text

"""`benchmarks/load.py` runs end to end (a few seconds, a few clients), so the script cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_the_load_benchmark_runs(tmp_path: Path) -> None:
    script = Path(__file__).parent.parent / "benchmarks" / "load.py"
    out, scratch = tmp_path / "load.json", tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, str(script), "--clients", "4", "--minutes", "0.15", "--max-tokens", "4", "--json-out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["served"] > 0 and figures["failed"] == 0
    assert figures["store_rows_minus_served"] == 0  # every completion served is in the token store
    assert not list(scratch.glob("art-*"))  # the tiny model and the server's files are removed

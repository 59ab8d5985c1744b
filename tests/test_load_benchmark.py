"""`benchmarks/load.py` runs end to end (a short soak, a few clients), so the script cannot rot: every protocol,
streamed and not, is served without a failure while steps commit and clients hang up mid-stream, and no step is
lost. Counts only: the timings and the memory figures belong to the full run (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROTOCOLS = ("chat", "responses", "messages", "completions")
KINDS = {f"{protocol}{stream}" for protocol in PROTOCOLS for stream in ("", " stream")}


@pytest.mark.slow
def test_the_soak_serves_every_protocol_without_failures_or_lost_steps(tmp_path: Path) -> None:
    script = Path(__file__).parent.parent / "benchmarks" / "load.py"
    out, scratch = tmp_path / "load.json", tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, str(script), "--clients", "8", "--minutes", "0.3", "--train-every", "4",
         "--disconnect-every", "2", "--max-tokens", "4", "--json-out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["failed"] == 0, figures["failures"]
    assert set(figures["by_protocol"]) == KINDS
    assert all(kind["served"] > 0 for kind in figures["by_protocol"].values())
    assert figures["disconnects"] > 0
    assert figures["steps_committed"] >= 2 and figures["train_failed"] == 0
    assert figures["stale_answers"] == 0 and figures["committed_never_served"] == []  # no step lost
    assert figures["last_step_served_at_end"]
    # every completion served is in the token store, and at most one row more per hung-up stream (its partial reply)
    assert 0 <= figures["store_rows_minus_served"] <= figures["disconnects"]
    assert not list(scratch.glob("art-*"))  # the tiny model and the server's files are removed

"""benchmarks/gpu.py: its CPU dry run measures every row and prints the table; the checkout import shim works."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
ROWS = [
    "ours PolicyTrainer (gc off)",
    "TRL GRPOTrainer (gc off)",
    "ours PolicyTrainer (gc on)",
    "TRL GRPOTrainer (gc on)",
    "ours TransformersEngine (4 concurrent generate)",
    "raw HF model.generate (batch 4)",
]


def load_script() -> ModuleType:
    return load_benchmark("gpu")


def test_package_dir_finder_maps_the_checkout() -> None:
    """Where art_agents is not installed (the GPU machine), the script finds it by pyproject's package-dir."""
    gpu = load_script()
    finder = gpu._PackageDirFinder({"art_agents": ROOT / "art_agents", "art_agents.server": ROOT / "server"})
    spec = finder.find_spec("art_agents.server")
    assert spec is not None and spec.origin == str(ROOT / "server" / "__init__.py")
    assert spec.submodule_search_locations == [str(ROOT / "server")]
    assert finder.find_spec("art_agents.elsewhere") is None


@pytest.mark.slow
def test_dry_run_prints_every_row(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--budget-seconds", "200"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    out = done.stdout
    assert "DRY RUN" in out and out.rstrip().endswith("DONE"), out
    lines = out.splitlines()
    for name in ROWS:
        row = next((line for line in lines if name in line), None)
        assert row is not None, f"no row {name!r} in:\n{out}"
        assert " tok/s " in row, row  # measured: a median, not "-"
    assert "ours / TRL GRPOTrainer tokens/s" in out
    if importlib.util.find_spec("vllm") is None:
        assert "vLLM: not installed, rows skipped" in out

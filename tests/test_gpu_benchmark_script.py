"""benchmarks/gpu.py: its CPU dry run measures every row and prints the table; the checkout import shim works."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import sysconfig
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
    "ours in this process",
    "ours in 1 trainer process",
    "ours TransformersEngine (4 concurrent generate)",
    "raw HF model.generate (batch 4)",
]


def load_script() -> ModuleType:
    return load_benchmark("gpu")


def test_the_checkout_is_linked_as_an_install_for_the_script_and_its_processes(tmp_path: Path) -> None:
    """Where art_agents is not installed (the GPU machine), the script and the trainer processes it starts import
    it from links laid out by pyproject's package-dir."""
    gpu = load_script()
    mapping = {
        "art_agents": ROOT / "art_agents",
        "art_agents.art": ROOT / "art_agents" / "art",
        "art_agents.server": ROOT / "server",
        "art_agents.server.training": ROOT / "server" / "training",
    }
    site = gpu.linked_package(mapping, tmp_path / "site")
    assert sorted(p.name for p in (site / "art_agents").iterdir() if p.name != "__pycache__") == sorted(
        {p.name for p in (ROOT / "art_agents").iterdir() if p.name != "__pycache__"} | {"server"}
    )
    code = "import art_agents.server.training.trainer_worker as w; print(w.__file__)"
    libraries = sysconfig.get_paths()["purelib"]  # -S: no editable install; -P: no cwd
    done = subprocess.run(
        [sys.executable, "-S", "-P", "-c", code],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), libraries])},
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip() == str(site / "art_agents" / "server" / "training" / "trainer_worker.py"), done.stderr


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
    assert re.search(r"families +gemma4: 4 replies \+ 1 train step +\d+\.\d s", out), out  # every family ran
    if importlib.util.find_spec("vllm") is None:
        assert "vLLM: not installed, rows skipped" in out

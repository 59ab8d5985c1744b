"""The server's CPU threads: brief OpenMP spinning unless the user chose, and a thread count set by flag or variable.

How much spinning costs on a busy machine is measured in benchmarks/first_requests.py, not here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from server_fixtures import free_port

SPIN_OF_SERVER = (
    "import os, art_agents.server; print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in __import__('sys').modules)"
)


def python(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env}, timeout=120, check=True
    )
    return done.stdout.strip()


def test_the_server_package_asks_for_brief_spinning_before_torch_loads() -> None:
    assert python(SPIN_OF_SERVER) == "1000 False"  # set in the environment, and torch not yet loaded


@pytest.mark.parametrize("chosen", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}])
def test_a_users_own_openmp_setting_is_kept(chosen: dict[str, str]) -> None:
    expected = chosen.get("GOMP_SPINCOUNT", "None")
    assert python(SPIN_OF_SERVER, **chosen) == f"{expected} False"


def test_cpu_threads_below_one_is_refused_naming_the_flag(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "art_agents", "serve", "--art-path", str(tmp_path / "art"), "--cpu-threads", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "--cpu-threads" in done.stderr
    assert not (tmp_path / "art").exists()


def test_the_variable_sets_the_servers_torch_threads(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "art_agents",
                "serve",
                "--art-path",
                str(tmp_path / "art"),
                "--port",
                str(free_port()),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "ART_CPU_THREADS": "1"},
        )
    try:
        deadline = time.monotonic() + 120  # a guard against a hang, not a speed limit: the server logs it at start
        while "Application startup complete" not in log.read_text() and time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()
            time.sleep(0.2)
        assert "torch CPU threads: 1" in log.read_text()
    finally:
        server.terminate()
        server.wait(timeout=60)

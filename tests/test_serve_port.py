"""`art-agents serve` on a port something else listens on: refused before anything loads, naming --port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def test_serve_on_a_port_in_use_is_one_line_naming_the_port_before_anything_loads(tmp_path: Path) -> None:
    art_path = tmp_path / "art"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "art_agents", "serve", "--port", str(port), "--art-path", str(art_path)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )  # fmt: skip
    assert result.returncode != 0
    assert result.stderr.splitlines() == [
        f"error: port {port} on 127.0.0.1 is already in use; stop what listens there or pass another --port"
    ]
    assert not art_path.exists()  # the server never opened its folder: nothing was loaded


def test_serve_on_an_address_of_another_machine_names_host_and_port(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "art_agents", "serve", "--host", "192.0.2.1", "--api-key", "k", "--port", "8123",
         "--art-path", str(tmp_path / "art")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: cannot listen on 192.0.2.1:8123 (") and line.endswith("check --host and --port")
    assert not (tmp_path / "art").exists()

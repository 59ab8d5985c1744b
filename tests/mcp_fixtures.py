"""Real MCP servers for the MCP tests: our own (stdio and HTTP) and published ones from PyPI.

`isolated_server_command` installs a published server into a venv of its own under
`<repo>/.mcp-servers/<package>`: servers pinned to `mcp<2` cannot share our venv (mcp 2.x).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from art_agents.integrations.mcp import MCPServer

REPO = Path(__file__).resolve().parents[1]
SERVERS = Path(__file__).parent / "mcp_servers"
KV_COMMAND = [sys.executable, str(SERVERS / "kv_server.py")]
BAD_SCHEMA_COMMAND = [sys.executable, str(SERVERS / "bad_schema_server.py")]
TIME_COMMAND = [sys.executable, "-m", "mcp_server_time"]
UNRULY_COMMAND = [sys.executable, str(SERVERS / "unruly_server.py")]  # huge answers; --latin1: invalid UTF-8


def kv_server(**options: object) -> MCPServer:
    return MCPServer(command=KV_COMMAND, **options)  # type: ignore[arg-type]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def isolated_server_command(package: str, entry: str, *requirements: str) -> list[str]:
    """argv of console script `entry` of `package`, pip-installed once into its own venv (reused while it works),
    with extra `requirements` such as an upper bound its metadata lacks."""
    venv = REPO / ".mcp-servers" / package
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    script, python = bindir / entry, bindir / "python"
    venv.parent.mkdir(exist_ok=True)
    with open(venv.parent / f"{package}.lock", "w") as lock:  # two test runs at once build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        check = [str(python), "-c", f"import importlib.metadata as m; m.distribution({package!r})"]
        if not (script.exists() and subprocess.run(check, capture_output=True).returncode == 0):
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pip = [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                package,
                *requirements,
            ]
            installed = subprocess.run(pip, capture_output=True, text=True, timeout=600)
            if installed.returncode != 0:
                raise RuntimeError(f"pip install {package} into {venv} failed:\n{installed.stderr[-2000:]}")
    return [str(script)]


@contextlib.contextmanager
def kv_http_server(startup_timeout: float = 30.0) -> Iterator[str]:
    """Run the kv server over streamable HTTP on a free loopback port; yields its URL, kills it on exit."""
    port = free_port()
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: an unread pipe would block a chatty server
        process = subprocess.Popen([*KV_COMMAND, "--http", str(port)], stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + startup_timeout
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"the kv server on port {port} did not start: {log.read()[-2000:].decode()}")
                time.sleep(0.05)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="session")
def kv_http() -> Iterator[str]:
    """URL of one kv server over HTTP, shared by the tests of this session (state is per MCP session)."""
    with kv_http_server() as url:
        yield url


@pytest.fixture(scope="session")
def calculator_command() -> list[str]:
    """`mcp-server-calculator` from PyPI (it needs mcp<2), in its own venv."""
    return isolated_server_command("mcp-server-calculator", "mcp-server-calculator")

"""Start and supervise `vllm serve` as a process of its own, so vLLM may live in its own virtualenv.

vLLM pins its own torch, transformers and fastapi, so it runs from the python named by
`--vllm-python` / `ART_VLLM_PYTHON` (default: this one) as `python -m vllm.entrypoints.cli.main
serve ...`, which is what the `vllm serve` script runs. Its output goes to a log file whose tail is
put in every error, since the reason vLLM failed (out of memory, a CUDA mismatch) is only there. A
watcher thread restarts it when it dies, then calls `on_restart` (the engine reloads its adapters).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from art_agents.backends.ports import free_port
from art_agents.server.errors import ServiceError
from art_agents.server.host.processes import end_group_with

log = logging.getLogger("art_agents.server")

PYTHON_ENV = "ART_VLLM_PYTHON"
SERVE_MODULE = "vllm.entrypoints.cli.main"


def vllm_python() -> str:
    """The python that runs vLLM: `$ART_VLLM_PYTHON` (set by `art-agents serve --vllm-python`), else this one."""
    return os.environ.get(PYTHON_ENV) or sys.executable


class VLLMUnavailable(ServiceError):
    """vLLM is not running (failed to start, died, restarting); the message carries its log tail."""

    def __init__(self, detail: str) -> None:
        super().__init__(503, detail, {"Retry-After": "5"})


@dataclass
class VLLMLaunch:
    """What to run: `python -m vllm.entrypoints.cli.main serve <base_model> <args>` with `env` added."""

    python: str
    base_model: str
    args: list[str]
    log_path: Path
    startup_timeout_s: float
    env: dict[str, str] = field(default_factory=dict)

    def command(self, port: int) -> list[str]:
        return [self.python, "-m", SERVE_MODULE, "serve", self.base_model, "--host", "127.0.0.1", "--port", str(port)]


class VLLMProcess:
    """One supervised vLLM server on a free loopback port."""

    def __init__(self, launch: VLLMLaunch, on_restart: Callable[[], None] | None = None) -> None:
        self.launch = launch
        self.on_restart = on_restart
        self.base_url = ""
        self.headers: dict[str, str] = {}  # none: it listens on loopback only, for this server
        self.failure: str | None = None  # why the last restart failed; requests are refused with it
        self._popen: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None  # ends vLLM if this server dies without stopping it
        self._ready = threading.Event()
        self._stopping = False
        self._lock = threading.Lock()
        self._log_offset = 0  # where this start's output begins in the log file
        self._exits: dict[int, tuple[int, str]] = {}  # pid -> exit code and log tail of a vLLM that died

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.failure is None

    def start(self) -> None:
        """Start vLLM and wait until `/health` answers 200; on failure stop it and raise with its log tail."""
        self._launch()
        self._ready.set()

    def _launch(self) -> None:
        with self._lock:
            self._ready.clear()
            port = free_port()
            self.launch.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_offset = self.launch.log_path.stat().st_size if self.launch.log_path.exists() else 0
            with self.launch.log_path.open("ab") as out:
                out.write(f"--- art-agents: starting vLLM at {time.ctime()} ---\n".encode())
                out.flush()
                self._popen = subprocess.Popen(
                    [*self.launch.command(port), *self.launch.args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, **self.launch.env},
                    start_new_session=True,  # its own process group: stop() also ends vLLM's engine-core children
                )
            self._watchdog = end_group_with(os.getpid(), self._popen.pid)  # a SIGKILLed server takes vLLM along
            self.base_url = f"http://127.0.0.1:{port}"
            try:
                self._wait_healthy()
            except VLLMUnavailable:
                self._kill()
                raise
            self.failure = None
            popen = self._popen
        threading.Thread(target=self._watch, args=(popen,), name="art-vllm-watch", daemon=True).start()
        log.info("vLLM (pid %d) serves %s at %s", popen.pid, self.launch.base_model, self.base_url)

    def wait_ready(self, timeout_s: float) -> None:
        """Block until vLLM serves (a restart may be under way); raise when it cannot."""
        if not self._ready.wait(timeout_s) or self.failure is not None:
            raise VLLMUnavailable(self.failure or f"vLLM did not come back within {timeout_s:.0f} s{self._tail()}")

    def died_message(self, pid: int | None) -> str:
        """What to tell a request whose connection to vLLM process `pid` broke: its exit and log, if it died."""
        deadline = time.monotonic() + 5  # the watcher records a killed process as soon as it is reaped
        while pid not in self._exits and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid not in self._exits:
            return f"the connection to vLLM at {self.base_url} failed while it is still running{self._tail()}"
        code, tail = self._exits[pid]
        return (
            f"vLLM (pid {pid}) exited with code {code} mid-request; it is being restarted and the current "
            f"adapter reloaded, retry the request{tail}"
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stopping = True
        self._ready.clear()
        self._kill(timeout_s)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.launch.startup_timeout_s
        assert self._popen is not None
        while time.monotonic() < deadline:
            code = self._popen.poll()
            if code is not None:
                raise VLLMUnavailable(f"vLLM exited with code {code} while starting{self._tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise VLLMUnavailable(
            f"vLLM did not answer {self.base_url}/health within {self.launch.startup_timeout_s:.0f} s "
            f"(ModelConfig.vllm_startup_timeout){self._tail()}"
        )

    def _watch(self, popen: subprocess.Popen[bytes]) -> None:
        """Restart vLLM once when it exits on its own; a failed restart leaves `failure` set for requests."""
        code = popen.wait()
        if self._stopping or popen is not self._popen:
            return
        self._ready.clear()
        self._exits[popen.pid] = (code, self._tail())
        log.error("vLLM (pid %d) exited with code %s; restarting it%s", popen.pid, code, self._exits[popen.pid][1])
        try:
            self._launch()
            if self.on_restart is not None:
                self.on_restart()  # before requests go on: they must find the adapters loaded
        except Exception as exc:
            if self._stopping:
                return
            self.failure = f"vLLM exited with code {code} and could not be restarted ({exc}); restart the server"
            log.exception("restarting vLLM failed")
        self._ready.set()

    def _kill(self, timeout_s: float = 30.0) -> None:
        popen = self._popen
        if popen is None or popen.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(popen.pid, sig)
            except ProcessLookupError:
                return
            try:
                popen.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def _tail(self, lines: int = 40) -> str:
        """The last lines vLLM wrote since this start, as a suffix for an error message."""
        try:
            with self.launch.log_path.open("rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        tail = "\n".join(text.rstrip().splitlines()[-lines:])
        return (
            f"; vLLM's log ({self.launch.log_path}) ends:\n{tail}" if tail else f"; vLLM's log: {self.launch.log_path}"
        )

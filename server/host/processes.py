"""Process liveness: stale checkpoint temp folders, a server whose parent died, and a vLLM whose server died
(no orphan keeps the model)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil


def is_alive(pid: int) -> bool:
    """Whether a process with this pid exists (a temp folder records only the pid, so a reused pid counts)."""
    return psutil.pid_exists(pid)


def exit_with_parent(pid: int, *, interval_s: float = 1.0) -> threading.Thread:
    """Send ourselves SIGTERM (uvicorn's graceful shutdown) once `pid` is gone or we were re-parented.

    psutil remembers the parent's start time, so a new process that reuses its pid is not taken for it.
    """
    try:
        parent: psutil.Process | None = psutil.Process(pid)
    except psutil.NoSuchProcess:
        parent = None

    def watch() -> None:
        while parent is not None and parent.is_running() and os.getppid() == pid:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="art-parent-watch", daemon=True)
    thread.start()
    return thread


def how_it_ended(code: int | None) -> str:
    """A process's exit status as words for an error message (None: it has not ended)."""
    if code is None:
        return "still running"
    if code < 0:
        how = f"killed by {signal.Signals(-code).name}"
        return how + ", often the out-of-memory killer" if code == -signal.SIGKILL else how
    return f"exit code {code}"


_GROUP_WATCHDOG = """
import os, signal, sys, time
import psutil

owner, group = int(sys.argv[1]), int(sys.argv[2])


def alive(process):
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_alive():
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False


try:
    watched = psutil.Process(owner)
except psutil.NoSuchProcess:
    watched = None
while watched is not None and alive(watched) and group_alive():
    time.sleep(0.5)
for sig in (signal.SIGTERM, signal.SIGKILL):
    deadline = time.monotonic() + 15
    while group_alive() and time.monotonic() < deadline:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            break
        time.sleep(0.5)
"""


def end_group_with(owner: int, group: int) -> subprocess.Popen[bytes]:
    """A watchdog process that ends process group `group` (SIGTERM, then SIGKILL) once `owner` is gone.

    For a child that runs foreign code (vLLM) and cannot watch its parent itself: when the server is
    killed with SIGKILL, nothing else would stop it holding the GPU. The watchdog exits with the group.
    """
    return subprocess.Popen(
        [sys.executable, "-c", _GROUP_WATCHDOG, str(owner), str(group)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the server's group does not reach it first
    )

"""Process liveness: stale checkpoint temp folders, and a server whose parent died (no orphan keeps the model)."""

from __future__ import annotations

import os
import signal
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

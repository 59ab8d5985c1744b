"""Process liveness: stale checkpoint temp folders, and a server whose parent died (no orphan keeps the model)."""

from __future__ import annotations

import os
import signal
import threading
import time


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def exit_with_parent(pid: int, *, interval_s: float = 1.0) -> threading.Thread:
    """Send ourselves SIGTERM (uvicorn's graceful shutdown) once `pid` is gone or we were re-parented."""

    def watch() -> None:
        while is_alive(pid) and os.getppid() == pid:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="art-parent-watch", daemon=True)
    thread.start()
    return thread

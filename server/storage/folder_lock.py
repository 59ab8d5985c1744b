"""One process owns a model folder, so two servers never write the same steps, history and token store.

The owner holds `<model_dir>/server.lock` with flock and writes {pid, host, started} into it, which a
refused server names. The kernel drops a flock when its process dies (kill -9 included), so a lock
left by a dead owner is taken over at once, without guessing from a pid that may have been reused.
A clean release (close, or interpreter exit) removes the file.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

LOCK_NAME = "server.lock"


class FolderInUse(RuntimeError):
    """Another live process owns the folder; the message names it."""


@dataclass(eq=False)
class FolderLock:
    path: Path
    fd: int

    def release(self) -> None:
        """Remove the lock file, then drop the flock (in this order: see `lock_folder`)."""
        if self.fd < 0:
            return
        _held.discard(self)
        self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = -1


_held: set[FolderLock] = set()


def lock_folder(folder: Path) -> FolderLock:
    """Own `folder` until `release()`; raises `FolderInUse` naming the owner if another process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderInUse(
                f"{folder} is in use by another art-agents server ({_owner(path)}); stop that server, or serve "
                "this model from another art path"
            ) from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)  # its owner released it between our open and flock: that file is gone, open the new one
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(owner).encode(), 0)
    lock = FolderLock(path, fd)
    _held.add(lock)
    return lock


def _owner(path: Path) -> str:
    try:
        owner = json.loads(path.read_text(encoding="utf-8"))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(owner["started"])))
        return f"pid {owner['pid']} on host {owner['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"its pid and host are not written yet; see {path}"


@atexit.register
def _release_all() -> None:
    for lock in list(_held):
        lock.release()

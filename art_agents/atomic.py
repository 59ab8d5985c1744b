"""Atomic file writes: a temp file in the same folder, fsynced, then renamed over the target.

A crash (even kill -9) leaves either the old file or the new one, never half of one. Logs that grow
by a line (`append_line`) are appended instead, without rewriting what is already there.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Replace `path` with `text` (UTF-8) atomically, creating its folder if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, new_file_mode())  # mkstemp's 0600 would outlive the rename
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def new_file_mode() -> int:
    """The mode `open()` gives a new file here (0o666 less the umask): what a file written through a temp file
    (mkstemp's, or safetensors', both 0o600) should end with, like every other file the same command writes."""
    try:  # Linux names the umask without changing it
        status = Path("/proc/self/status").read_text(encoding="ascii")
        return 0o666 & ~int(next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), 8)
    except (OSError, StopIteration):
        mask = os.umask(0o022)
        os.umask(mask)
        return 0o666 & ~mask


def append_line(path: str | Path, line: str) -> Path:
    """Append `line` + newline to `path`, fsynced; a line cut short by an earlier crash is dropped first.

    Appending costs the same however long the file is, and whole lines are all a reader ever sees
    once this returns.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                handle.truncate(_last_line_end(handle, size))
        handle.write(line.encode("utf-8") + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    return path


def _last_line_end(handle: BinaryIO, size: int, chunk: int = 4096) -> int:
    """The offset just after the last newline before `size` (0 if none)."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        handle.seek(start)
        found = handle.read(end - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0

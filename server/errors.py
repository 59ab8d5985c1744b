"""The one error type the server's operations raise for a request they refuse, and how a full disk is named."""

from __future__ import annotations

import errno
import sqlite3


class ServiceError(Exception):
    """A request the server refuses; `status` is the HTTP status, the message says what to fix."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers


def disk_full(exc: BaseException | None) -> bool:
    """Whether `exc` or what caused it is a full disk (ENOSPC, SQLite's SQLITE_FULL): the server's state, not a bug."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return True
        exc = exc.__cause__
    return False


def describe(exc: BaseException) -> str:
    """`Type: message` for a client, led by what to do when the cause is a full disk."""
    text = f"{type(exc).__name__}: {exc}"
    return f"the server's disk is full; free space on it and retry ({text})" if disk_full(exc) else text

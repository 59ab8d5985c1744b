"""The one error type the server's operations raise for a request they refuse."""

from __future__ import annotations


class ServiceError(Exception):
    """A request the server refuses; `status` is the HTTP status, the message says what to fix."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers

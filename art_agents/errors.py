"""Errors the toolkit raises on purpose; each message names the problem and the fix."""

from __future__ import annotations


class ArtError(Exception):
    """Base class for every error raised by art_agents."""


class TooManyExceptions(ArtError):
    """More rollouts failed than `max_exceptions` allows."""


class SetupError(ArtError):
    """An error every rollout would hit (no endpoint, unknown model, server down): a gather stops at once on it.

    Counting it as one failed rollout would only hide the fix; see `art_agents.fatal` for what qualifies.
    """


class ServerError(ArtError):
    """The art-agents server answered with an error; `status` and `detail` come from its body."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"server answered {status}: {detail}")
        self.status = status
        self.detail = detail


class MissingExtra(ArtError, ImportError):
    """A feature's optional dependencies (a pip extra) are not installed; the one-line message says which."""

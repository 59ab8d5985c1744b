"""Errors the toolkit raises on purpose; each message names the problem and the fix."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError


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


def settings_error(
    exc: ValidationError,
    file: Path | None,
    command: Callable[..., object] | None = None,
    schema: type[BaseModel] | None = None,
) -> str:
    """A settings error in one sentence naming each wrong setting by its flag (if `command` has one) and its
    place in `file`, and a missing one with what to add (its description in `schema`); pydantic's own text spans
    lines, dumps the whole input and links to its docs."""
    options = inspect.signature(command).parameters if command else {}
    fields = schema.model_fields if schema else {}
    problems = []
    for error in exc.errors():
        leaf = str(error["loc"][-1]) if error["loc"] else ""
        places = [f"--{leaf.replace('_', '-')}"] if leaf in options else []
        if file is not None or not places:
            places.append(f"{'.'.join(map(str, error['loc']))} in {file or 'the settings'}")
        if error["type"] == "missing":
            about = fields[leaf].description if leaf in fields and len(error["loc"]) == 1 else None
            problems.append(f"{' or '.join(places)} is missing; add it" + (f" ({about})" if about else ""))
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        got = "" if error["type"] == "value_error" else f" (got {error.get('input')!r})"
        problems.append(f"{' or '.join(places)}: {message}{got}")
    return "; ".join(problems)

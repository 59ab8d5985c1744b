"""Refusing by name what a protocol's request asks for and the server cannot honour, in one wording for all."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# field -> (its neutral values, why anything else cannot be honoured)
Refusals = Mapping[str, tuple[tuple[Any, ...], str]]


def refuse_unless_neutral(
    extra: Mapping[str, Any], table: Refusals, *, unknown: str | None = None, accepted: frozenset[str] = frozenset()
) -> None:
    """Raise `ValueError` for the first field of `extra` in `table` that is not given a neutral value.

    None is always neutral, and so is a mapping of Nones (`{"effort": null}` asks for nothing). With `unknown`,
    a field in neither `table` nor `accepted` is refused with that reason.
    """
    for name, given in extra.items():
        if name in accepted or (name not in table and unknown is None):
            continue
        neutral, why = table.get(name, ((), unknown or ""))
        value = {k: v for k, v in given.items() if v is not None} if isinstance(given, dict) else given
        if value is not None and value not in neutral:
            raise ValueError(f"{name}={given!r} is not supported by this server ({why}); leave it out")


def refuse_forced_tool(choice: Any) -> None:
    """Only `auto` and `none` can be honoured: the server samples freely and cannot force a tool call."""
    if choice not in (None, "auto", "none"):
        raise ValueError(f"tool_choice={choice!r} is not supported: the server cannot force a tool call; use 'auto'")

"""Names that become folder names (model, project): one rule for the client and the server."""

from __future__ import annotations

import re

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


def check_safe_name(value: str, what: str = "name") -> str:
    """Return `value` if it is safe as one path component; else raise ValueError saying what to use."""
    if not _SAFE_NAME.fullmatch(value) or ".." in value:  # fullmatch: "$" would accept a trailing newline
        raise ValueError(
            f"{what} {value!r} is not allowed: use letters, digits, '_', '-' and '.', at most 128 characters, "
            "no '/' and no '..' (it becomes a folder name)"
        )
    return value

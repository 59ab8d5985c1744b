"""Trajectory groups on disk: one JSON object per line, versioned, written atomically; and history rows."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from art_agents.atomic import write_text_atomic
from art_agents.trajectory import SCHEMA_VERSION, TrajectoryGroup


def write_groups(path: str | Path, groups: Iterable[TrajectoryGroup]) -> Path:
    """Write groups to `path` via a temp file and a rename, so a crash never leaves half a file."""
    return write_text_atomic(path, "".join(group.model_dump_json() + "\n" for group in groups))


def read_groups(path: str | Path) -> list[TrajectoryGroup]:
    """Read groups back; a line from a newer schema or a malformed line is named in the error."""
    groups: list[TrajectoryGroup] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                group = TrajectoryGroup.model_validate_json(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a valid trajectory group: {exc}") from exc
            if group.schema_version > SCHEMA_VERSION:
                raise ValueError(
                    f"{path}:{number}: schema_version {group.schema_version} is newer than this art-agents "
                    f"understands ({SCHEMA_VERSION}); upgrade art-agents"
                )
            groups.append(group)
    return groups


def read_history(model_dir: str | Path) -> list[dict[str, Any]]:
    """A model's history.jsonl rows in file order; a torn or malformed line (a crash mid-write) is skipped."""
    path = Path(model_dir) / "history.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows

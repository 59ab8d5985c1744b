"""Disk cache of judge answers, so rerunning a scoring step does not pay the judge twice.

The key is the judge model, the rubric and the exact judge prompt (which holds the content and
the order shown); credentials, endpoints and timeouts are not part of it. Only answers that
passed validation are stored, and they are validated again when read.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from art_agents.atomic import write_text_atomic

CACHE_FORMAT = 1


def default_cache_dir() -> Path:
    """`$ART_AGENTS_RULER_CACHE`, else `$XDG_CACHE_HOME/art_agents/ruler` (~/.cache by default)."""
    explicit = os.environ.get("ART_AGENTS_RULER_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "art_agents" / "ruler"


class CacheEntry(BaseModel):
    format: int = CACHE_FORMAT
    judge_model: str
    content: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    created_at: float


class JudgeCache:
    """One JSON file per key under `root`; written to a temp file and renamed, so never half-written."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @staticmethod
    def key(judge_model: str, rubric: str, messages: list[dict[str, Any]], response_format: dict[str, Any]) -> str:
        payload = {
            "format": CACHE_FORMAT,
            "judge_model": judge_model,
            "rubric": rubric,
            "messages": messages,
            "response_format": response_format,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> CacheEntry | None:
        """The stored entry, or None when absent or unreadable (a corrupt file is a miss, not a crash)."""
        try:
            return CacheEntry.model_validate_json(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValidationError, ValueError):
            return None

    def put(
        self, key: str, judge_model: str, content: str, *, prompt_tokens: int, completion_tokens: int, cost_usd: float
    ) -> None:
        entry = CacheEntry(
            judge_model=judge_model,
            content=content,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=cost_usd,
            created_at=time.time(),
        )
        try:
            write_text_atomic(self._path(key), entry.model_dump_json())
        except OSError as exc:  # a read-only or full cache must not cost an answer already paid for
            warnings.warn(f"RULER cache at {self.root} is not writable ({exc}); answer not cached", stacklevel=2)

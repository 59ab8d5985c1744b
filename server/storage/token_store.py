"""The token store: what the server actually sampled, keyed by completion id.

Training uses these exact token ids and sampler logprobs instead of re-tokenizing messages, so
chat-template drift cannot creep in. Each record keeps the temperature its logprobs are taken at
(the sampling temperature), so the trainer can train the policy that sampled. SQLite in WAL mode
with synchronous=FULL: a row is on disk before the HTTP response that names its completion id is
sent, and survives a kill -9.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field


class TokenRecord(BaseModel):
    completion_id: str
    model: str
    policy_step: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] = Field(
        description="Sampler logprob of each completion id: log-softmax of logits / temperature, before top-p."
    )
    temperature: float = Field(1.0, gt=0, description="Temperature of the logprobs (the sampling one; 1 for greedy).")
    top_p: float = Field(1.0, gt=0, le=1, description="The request's top-p (recorded; the logprobs are untruncated).")
    created_at: float = Field(default_factory=time.time)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    completion_id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    policy_step INTEGER NOT NULL,
    prompt_ids TEXT NOT NULL,
    completion_ids TEXT NOT NULL,
    logprobs TEXT NOT NULL,
    created_at REAL NOT NULL,
    temperature REAL NOT NULL DEFAULT 1.0,
    top_p REAL NOT NULL DEFAULT 1.0
)
"""
_ADDED_COLUMNS = {"temperature": "REAL NOT NULL DEFAULT 1.0", "top_p": "REAL NOT NULL DEFAULT 1.0"}
_COLUMNS = "completion_id, model, policy_step, prompt_ids, completion_ids, logprobs, created_at, temperature, top_p"


@dataclass
class _Write:
    rows: list[tuple]
    done: bool = False
    error: Exception | None = None


class TokenStore:
    """Thread-safe SQLite store at `path` (usually `<model_dir>/tokens/store.sqlite`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # the connection
        self._queue_lock = threading.Lock()
        self._queued: list[_Write] = []  # writes waiting for the next commit
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)
        present = {row[1] for row in self._db.execute("PRAGMA table_info(tokens)")}
        for name, kind in _ADDED_COLUMNS.items():  # stores written before these columns: temperature-1 logprobs
            if name not in present:
                self._db.execute(f"ALTER TABLE tokens ADD COLUMN {name} {kind}")

    def add(self, record: TokenRecord) -> None:
        self.add_many([record])

    def add_many(self, records: Iterable[TokenRecord]) -> None:
        """Insert records in one committed transaction (the n choices of one request).

        Group commit: callers that arrive while a commit is on disk are written together by the next one
        (one fsync for a group's concurrent completions instead of one each). If that shared transaction
        fails, each caller's records are retried in a transaction of their own, so one bad write fails alone.
        """
        write = _Write(
            [
                (
                    r.completion_id,
                    r.model,
                    r.policy_step,
                    json.dumps(r.prompt_ids),
                    json.dumps(r.completion_ids),
                    json.dumps(r.logprobs),
                    r.created_at,
                    r.temperature,
                    r.top_p,
                )
                for r in records
            ]
        )
        with self._queue_lock:
            self._queued.append(write)
        with self._lock:
            if not write.done:  # else an earlier caller committed it with its own
                with self._queue_lock:
                    group, self._queued = self._queued, []
                self._commit(group)
        if write.error is not None:
            raise write.error

    def _commit(self, group: list[_Write]) -> None:
        try:
            self._insert([row for write in group for row in write.rows])
        except Exception as exc:
            if len(group) == 1:
                group[0].error = exc
            else:
                for write in group:
                    try:
                        self._insert(write.rows)
                    except Exception as alone:
                        write.error = alone
        for write in group:
            write.done = True

    def _insert(self, rows: list[tuple]) -> None:
        self._db.execute("BEGIN")
        try:
            self._db.executemany(f"INSERT INTO tokens ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # a failed COMMIT (a full disk) may have rolled back already
                self._db.execute("ROLLBACK")
            raise

    def get(self, completion_id: str) -> TokenRecord | None:
        return self.get_many([completion_id]).get(completion_id)

    def get_many(self, ids: Iterable[str]) -> dict[str, TokenRecord]:
        wanted = list(dict.fromkeys(ids))
        found: dict[str, TokenRecord] = {}
        with self._lock:
            for start in range(0, len(wanted), 500):  # SQLite's bound-parameter limit
                chunk = wanted[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(f"SELECT {_COLUMNS} FROM tokens WHERE completion_id IN ({marks})", chunk)
                for row in rows.fetchall():
                    found[row[0]] = _record(row)
        return found

    def delete_steps(self, steps: Iterable[int]) -> int:
        """Drop the records sampled at `steps` (their checkpoints were deleted); returns how many."""
        wanted = list(steps)
        if not wanted:
            return 0
        marks = ",".join("?" * len(wanted))
        with self._lock:
            return self._db.execute(f"DELETE FROM tokens WHERE policy_step IN ({marks})", wanted).rowcount

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM tokens").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _record(row: tuple) -> TokenRecord:
    return TokenRecord(
        completion_id=row[0],
        model=row[1],
        policy_step=row[2],
        prompt_ids=json.loads(row[3]),
        completion_ids=json.loads(row[4]),
        logprobs=json.loads(row[5]),
        created_at=row[6],
        temperature=row[7],
        top_p=row[8],
    )

"""The token store commits concurrent writes together, and a write that fails does so alone."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from art_agents.server.storage.token_store import TokenRecord, TokenStore

WRITERS = 16


def record(completion_id: str) -> TokenRecord:
    return TokenRecord(
        completion_id=completion_id, model="m@0", policy_step=0, prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.5]
    )


def concurrently(store: TokenStore, ids: list[str]) -> list[Exception | None]:
    """Each id added from its own thread, all released at once; the error each caller saw."""
    start = threading.Barrier(len(ids))
    errors: list[Exception | None] = [None] * len(ids)

    def add(i: int) -> None:
        start.wait()
        try:
            store.add(record(ids[i]))
        except Exception as exc:
            errors[i] = exc

    threads = [threading.Thread(target=add, args=(i,)) for i in range(len(ids))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_concurrent_writes_share_commits_and_all_land(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = TokenStore(tmp_path / "store.sqlite")
    commits: list[int] = []
    insert = TokenStore._insert

    def slow_disk(self: TokenStore, rows: list[tuple]) -> None:
        commits.append(len(rows))
        time.sleep(0.05)  # a slow fsync: the writers that arrive meanwhile queue for the next commit
        insert(self, rows)

    monkeypatch.setattr(TokenStore, "_insert", slow_disk)
    assert concurrently(store, [f"c{i}" for i in range(WRITERS)]) == [None] * WRITERS
    store.close()
    reopened = TokenStore(tmp_path / "store.sqlite")  # committed: on disk
    assert reopened.count() == WRITERS
    assert sum(commits) == WRITERS and len(commits) <= 3


def test_a_failing_write_in_a_shared_commit_fails_alone(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "store.sqlite")
    store.add(record("taken"))
    ids = [f"c{i}" for i in range(WRITERS - 1)] + ["taken"]  # a duplicate completion id breaks its transaction
    errors = concurrently(store, ids)
    assert all(e is None for e in errors[:-1])
    assert errors[-1] is not None and "UNIQUE" in str(errors[-1])
    assert store.count() == WRITERS

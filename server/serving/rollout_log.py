"""What the server answered per rollout id: a count for every rollout, and the calls themselves where asked.

A rollout id arrives in the `x-art-rollout-id` header (clients the toolkit builds, or any client inside
`art.rollout()` once it targets a known server) or in a rollout-scoped base URL `/r/<id>/v1`. Calls are kept
only for rollouts that asked for them (`x-art-rollout-record`, or an opened scoped URL): they are what the
client assembles into the trajectory when the rollout ends, so an agent in any process, speaking any of the
server's protocols, is captured. Both maps are bounded, so a long-running server forgets old rollouts.
"""

from __future__ import annotations

import collections

from art_agents.server.errors import ServiceError
from art_agents.wire import RolloutCall, RolloutRecord


class RolloutLog:
    def __init__(self, limit: int = 100_000, kept_limit: int = 10_000) -> None:
        self.limit, self.kept_limit = limit, kept_limit
        self._counts: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._calls: collections.OrderedDict[str, list[RolloutCall]] = collections.OrderedDict()
        self._open: set[str] = set()
        self._finished: collections.OrderedDict[str, None] = collections.OrderedDict()

    def add(self, rollout_id: str, call: RolloutCall | None = None) -> None:
        """Count one answered call, and keep `call` when the rollout records its calls."""
        self._counts[rollout_id] = self._counts.pop(rollout_id, 0) + 1
        if len(self._counts) > self.limit:
            self._counts.popitem(last=False)
        if call is not None and self.keeps(rollout_id):
            self._calls.setdefault(rollout_id, []).append(call)
            if len(self._calls) > self.kept_limit:
                forgotten, _ = self._calls.popitem(last=False)
                self._open.discard(forgotten)

    def keeps(self, rollout_id: str) -> bool:
        return rollout_id in self._open or rollout_id in self._calls

    def start_keeping(self, rollout_id: str) -> None:
        """The header path: keep this rollout's calls from now on (idempotent)."""
        self._calls.setdefault(rollout_id, [])

    def get(self, rollout_id: str) -> int:
        return self._counts.get(rollout_id, 0)

    def open(self, rollout_id: str) -> RolloutRecord:
        """Open the rollout-scoped URL for `rollout_id`; a finished id cannot be reopened."""
        if rollout_id in self._finished:
            raise ServiceError(409, f"rollout {rollout_id!r} has finished; open a new rollout for new calls")
        self._open.add(rollout_id)
        self.start_keeping(rollout_id)
        return self.record(rollout_id)

    def check_open(self, rollout_id: str) -> None:
        """Refuse a call through `/r/<id>/v1` unless that rollout is open."""
        if rollout_id in self._open:
            return
        if rollout_id in self._finished:
            raise ServiceError(
                404, f"rollout {rollout_id!r} has finished; its base URL takes no more calls (start a new rollout)"
            )
        raise ServiceError(
            404,
            f"rollout {rollout_id!r} is unknown to this server; get a rollout-scoped base URL from "
            "`await model.rollout_base_url()` inside `art.rollout()`",
        )

    def record(self, rollout_id: str) -> RolloutRecord:
        return RolloutRecord(
            id=rollout_id,
            completions=self.get(rollout_id),
            open=rollout_id in self._open,
            calls=list(self._calls.get(rollout_id, [])),
        )

    def finish(self, rollout_id: str) -> RolloutRecord:
        """Close the rollout and hand over (and forget) the calls it kept."""
        record = self.record(rollout_id)
        self._calls.pop(rollout_id, None)
        if rollout_id in self._open:
            self._open.discard(rollout_id)
            self._finished[rollout_id] = None
            if len(self._finished) > self.limit:
                self._finished.popitem(last=False)
        return record

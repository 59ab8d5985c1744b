"""`previous_response_id`: recent Responses conversations, kept in memory so a follow-up continues one."""

from __future__ import annotations

import collections
import json
from typing import Any

from art_agents.server.errors import ServiceError


class Conversations:
    """Recent responses' conversations in chat form (without their instructions, which OpenAI does not carry over),
    by response id, so `previous_response_id` continues one. In memory and bounded in number and in JSON characters
    (agents that resend the whole input each call would otherwise fill it): the least recently used are forgotten."""

    def __init__(self, limit: int = 10_000, max_chars: int = 64_000_000) -> None:
        self.limit, self.max_chars = limit, max_chars
        self._kept: collections.OrderedDict[str, tuple[list[dict[str, Any]], int]] = collections.OrderedDict()
        self._chars = 0

    def history(self, response_id: str | None) -> list[dict[str, Any]]:
        """The messages of `response_id`'s conversation, its reply included; [] for None."""
        if response_id is None:
            return []
        kept = self._kept.get(response_id)
        if kept is None:
            raise ServiceError(
                404,
                f"previous_response_id={response_id!r} is unknown to this server: it keeps recent responses made "
                f"with `store` left on (at most {self.limit}, {self.max_chars} characters in all) in memory, and none "
                "survive a restart; send the whole conversation as input instead",
            )
        self._kept.move_to_end(response_id)
        return list(kept[0])

    def keep(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        size = len(json.dumps(messages))
        self._kept[response_id] = (messages, size)
        self._chars += size
        while len(self._kept) > self.limit or self._chars > self.max_chars:
            _, (_, forgotten) = self._kept.popitem(last=False)
            self._chars -= forgotten

"""Incremental decoding of one streamed choice, aware of stop strings and split UTF-8 characters."""

from __future__ import annotations

from typing import Any


class IncrementalText:
    """Decodes one choice token by token, holding back what a stop string or a split character may change."""

    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.ids: list[int] = []
        self.sent = 0

    def push(self, token: int) -> str:
        """Add a sampled token; return the text that is now certain to be part of the answer."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""  # a multi-byte character is not complete yet
        if any(s in text[max(0, self.sent - len(s)) :] for s in self.stop):
            return ""  # a stop string ended the choice; the final message has the exact text
        safe = len(text) - max((_overlap(text, s) for s in self.stop), default=0)
        piece, self.sent = text[self.sent : safe], max(self.sent, safe)
        return piece


def _overlap(text: str, stop: str) -> int:
    """Length of the longest tail of `text` that is a head of `stop`."""
    return next((k for k in range(min(len(text), len(stop) - 1), 0, -1) if stop.startswith(text[-k:])), 0)

"""Incremental decoding of one streamed choice, aware of stop strings and split UTF-8 characters."""

from __future__ import annotations

from typing import Any


class IncrementalDecoder:
    """The text of a growing list of token ids, decoding only the last few tokens per new one.

    Decoding everything again at every token costs O(n^2) over a reply. As vLLM's detokenizer, this
    decodes a window from a few tokens back (so merges and spaces at token boundaries come out right)
    and appends what the new token adds; a token that ends inside a multi-byte character waits.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # tokens whose text is already in `self.text`

    def push(self, token: int) -> str:
        """Add a token; return the text it completed (may be empty)."""
        self.ids.append(token)
        decode = self.tokenizer.decode
        known = decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        window = decode(self.ids[self._prefix :], skip_special_tokens=True)
        if window.endswith("\ufffd") or len(window) <= len(known):
            return ""  # a multi-byte character is not complete yet, or the token adds no text
        added = window[len(known) :]
        self.text += added
        self._prefix, self._read = self._read, len(self.ids)
        return added


class IncrementalText:
    """Decodes one choice token by token, holding back what a stop string or a split character may change."""

    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.decoder = IncrementalDecoder(tokenizer)
        self.stop = [s for s in stop if s]
        self.sent = 0

    def push(self, token: int) -> str:
        """Add a sampled token; return the text that is now certain to be part of the answer."""
        if not self.decoder.push(token):
            return ""
        text = self.decoder.text
        if any(s in text[max(0, self.sent - len(s)) :] for s in self.stop):
            return ""  # a stop string ended the choice; the final message has the exact text
        safe = len(text) - max((_overlap(text, s) for s in self.stop), default=0)
        piece, self.sent = text[self.sent : safe], max(self.sent, safe)
        return piece


def _overlap(text: str, stop: str) -> int:
    """Length of the longest tail of `text` that is a head of `stop`."""
    return next((k for k in range(min(len(text), len(stop) - 1), 0, -1) if stop.startswith(text[-k:])), 0)

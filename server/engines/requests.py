"""A request waiting in or running through the transformers engine's batch, and each of its choices as a row."""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass, field

from art_agents.server.engines.protocol import OlderStep, Sample, SamplingParams, TokenCallback
from art_agents.server.engines.stream_text import IncrementalDecoder


@dataclass
class Request:
    """One `generate` call: its prompt, settings and future, and its choices' samples as their rows finish."""

    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[list[Sample]]
    on_token: TokenCallback | None = None
    older: OlderStep | None = None
    cancel: threading.Event | None = None  # set when the client went away: stop at the next token
    streamed: bool = False  # tokens already went out to the client
    alone: bool = False  # failed in a batch: retried in a batch of its own
    samples: list[Sample | None] = field(default_factory=list)  # by choice, filled as rows finish


@dataclass
class Row:
    """One choice being decoded: its random stream, the tokens so far, and (with stop strings) its text."""

    request: Request
    choice: int
    random: random.Random
    text: IncrementalDecoder | None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None


def truncate_at_stop(text: str, stop: list[str]) -> str | None:
    """The text before the first stop string, or None when none occurs."""
    cuts = [text.index(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else None

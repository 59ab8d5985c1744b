"""What every engine offers the rest of the server, and the types it speaks.

An engine samples completions from a model's published checkpoints. It never hands its model to the trainer:
training owns its own policy (training/policy.py) and publishes each checkpoint, which the engine loads
(`publish_checkpoint`) before the step is committed. The one thing an engine may share is its base weights
(`base_weights`), read-only, so a trainer on the same device needs no second copy of them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from art_agents.server.engines.prefix_cache import PrefillTokens


@dataclass
class SamplingParams:
    max_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    @property
    def logprob_temperature(self) -> float:
        """The temperature logprobs are taken at: the sampling one, or 1 for greedy decoding."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class Sample:
    """One choice: the sampled ids, their logprobs, the text they decode to, and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: Literal["stop", "length", "cancelled"]
    step: int
    temperature: float = 1.0  # of the logprobs


TokenCallback = Callable[[int, int], None]
"""Called from the engine's worker thread with (choice index, token id) as each token is sampled."""


class EngineBusy(RuntimeError):
    """The engine's queue is full (`ModelConfig.max_queued_requests`); the client should retry later."""

    def __init__(self, queued: int) -> None:
        super().__init__(f"the engine already has {queued} requests waiting; retry later")


@dataclass(frozen=True)
class OlderStep:
    """A checkpoint before the latest, served on request (`name@N`): its step and folder."""

    step: int
    checkpoint: Path


class Engine(Protocol):
    """What the service needs from an engine: the transformers, scripted and vLLM engines implement it."""

    tokenizer: Any
    step: int  # the served step
    longest_token_bytes: int  # the most bytes one token stands for: sizes requests before tokenizing
    prefill_tokens: PrefillTokens  # prompt tokens computed and served from a prefix cache, for the step's history

    def base_weights(self) -> Any | None:
        """The in-process base model under the served LoRA, for a trainer on its device to share read-only; None
        when the weights live in another process (vLLM)."""
        ...

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_token: TokenCallback | None = None,
        older: OlderStep | None = None,
        cancel: threading.Event | None = None,
        route: str | None = None,
    ) -> list[Sample]:
        """Sample `params.n` choices. `route` (a rollout id) keeps a rollout's calls on one replica behind a
        `ReplicaRouter`; a single engine has nowhere else to send them."""
        ...

    def load_adapter(self, path: str | Path) -> None:
        """Serve the checkpoint at `path` as the current step (opening a model, a rollback)."""
        ...

    def publish_checkpoint(self, step: int, path: Path) -> None:
        """Load checkpoint `step` before it is committed and served; raising fails the step (called while paused)."""
        ...

    def forget_older(self) -> None:
        """Unload older steps' adapters (their folders may be deleted or replaced)."""
        ...

    def paused(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold generation (running requests finish, none start) while the served checkpoint changes."""
        ...

    def beside_training(self) -> contextlib.AbstractAsyncContextManager[None]:
        """What the engine does while a step trains: serve on, or make room on a device it shares with the trainer."""
        ...

    async def close(self) -> None: ...

"""Several engines of one model behind one `Engine` face (`ModelConfig.replicas`; one vLLM per node, `vllm_nodes`).

A rollout's calls (one `route`: its rollout id) stay on the replica that served its first call, whose prefix
cache holds its earlier turns; a new rollout, or a call without one, goes to the replica with the fewest
requests in flight. A checkpoint is published to every replica while all of them are paused, so no replica
serves a step another has not loaded, and the step changes for all at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from art_agents.server.engines.prefix_cache import PrefillTokens
from art_agents.server.engines.protocol import Engine, OlderStep, Sample, SamplingParams, TokenCallback

ROUTES_KEPT = 4096  # rollouts remembered; older ones are routed afresh (their cache entries are cold by then)


class _PrefillOfAll(PrefillTokens):
    """Every replica's prefill counts, added up, for the step's history row."""

    def __init__(self, replicas: list[Engine]) -> None:
        super().__init__()
        self.replicas = replicas

    def take_metrics(self) -> dict[str, float]:
        self.computed = sum(r.prefill_tokens.computed for r in self.replicas)
        self.cached = sum(r.prefill_tokens.cached for r in self.replicas)
        return super().take_metrics()


class ReplicaRouter:
    """Routes each request to one of `replicas`; everything that changes what is served goes to all of them."""

    def __init__(self, replicas: list[Engine]) -> None:
        if not replicas:
            raise ValueError("a router needs at least one replica")
        self.replicas = replicas
        self.tokenizer = replicas[0].tokenizer
        self.longest_token_bytes = replicas[0].longest_token_bytes
        self.prefill_tokens = _PrefillOfAll(replicas)
        self.in_flight = [0] * len(replicas)
        self.served = [0] * len(replicas)  # requests each replica has taken
        self._routes: OrderedDict[str, int] = OrderedDict()

    @property
    def step(self) -> int:
        return self.replicas[0].step

    @step.setter
    def step(self, value: int) -> None:
        for replica in self.replicas:
            replica.step = value

    def base_weights(self) -> Any | None:
        return self.replicas[0].base_weights()

    def pick(self, route: str | None) -> int:
        """The replica for `route`: where it went before, else the least busy (the first among equals)."""
        if route is not None and route in self._routes:
            self._routes.move_to_end(route)
            return self._routes[route]
        chosen = min(range(len(self.replicas)), key=lambda i: (self.in_flight[i], self.served[i]))
        if route is not None:
            self._routes[route] = chosen
            if len(self._routes) > ROUTES_KEPT:
                self._routes.popitem(last=False)
        return chosen

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_token: TokenCallback | None = None,
        older: OlderStep | None = None,
        cancel: threading.Event | None = None,
        route: str | None = None,
    ) -> list[Sample]:
        index = self.pick(route)
        self.in_flight[index] += 1
        self.served[index] += 1
        try:
            return await self.replicas[index].generate(prompt_ids, params, on_token, older, cancel)
        finally:
            self.in_flight[index] -= 1

    def load_adapter(self, path: str | Path) -> None:
        for replica in self.replicas:
            replica.load_adapter(path)

    def publish_checkpoint(self, step: int, path: Path) -> None:
        for replica in self.replicas:
            replica.publish_checkpoint(step, path)

    def forget_older(self) -> None:
        for replica in self.replicas:
            replica.forget_older()

    def paused(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._in_every(lambda replica: replica.paused())

    def beside_training(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._in_every(lambda replica: replica.beside_training())

    @contextlib.asynccontextmanager
    async def _in_every(
        self, context: Callable[[Engine], contextlib.AbstractAsyncContextManager[None]]
    ) -> AsyncIterator[None]:
        """Inside `context` of every replica at once (entered in order, left in reverse)."""
        async with contextlib.AsyncExitStack() as stack:
            for replica in self.replicas:
                await stack.enter_async_context(context(replica))
            yield

    async def close(self) -> None:
        for replica in self.replicas:
            await replica.close()

"""Chat calls through a model's client around a train call, each a rollout of its own, with when it was sent, when
it was answered and which step answered: what shows whether any engine behind the server (a replica, a node)
served the old step after one of them served the new."""

from __future__ import annotations

import asyncio
import time

from art_agents import TrainableModel, Trajectory, TrajectoryGroup, rollout
from art_agents.train_config import TrainConfig
from art_agents.wire import TrainResult


class StepTimeline:
    def __init__(self, model: TrainableModel) -> None:
        self.model = model
        self.client = model.openai_client()
        self.seen: list[tuple[float, float, int]] = []  # (sent, answered, step)

    async def ask(self, text: str) -> Trajectory:
        """One call in a rollout of its own (so the server routes it afresh); rewarded by its answer's length mod 3,
        so a group's rewards differ."""
        async with rollout() as trajectory:
            sent = time.monotonic()
            reply = await self.client.chat.completions.create(
                model=self.model.name, messages=[{"role": "user", "content": text}], max_tokens=4
            )
            self.seen.append((sent, time.monotonic(), int(reply.model.rsplit("@", 1)[1])))
            trajectory.reward = len(reply.choices[0].message.content or "") % 3
        return trajectory

    async def groups(self) -> list[TrajectoryGroup]:
        """Two groups of four calls, asked concurrently."""
        return [TrajectoryGroup(await asyncio.gather(*(self.ask(f"q{g} {i}") for i in range(4)))) for g in range(2)]

    async def train_while_asking(self) -> TrainResult:
        """`model.train` on `groups()` with four calls in flight throughout, then eight more at once;
        closes the client."""
        groups = await self.groups()
        stop = asyncio.Event()

        async def keep_asking() -> None:
            while not stop.is_set():
                await asyncio.gather(*(self.ask("during") for _ in range(4)))

        during = asyncio.create_task(keep_asking())
        try:
            result = await self.model.train(groups, TrainConfig(learning_rate=1e-3), progress=False)
        finally:
            stop.set()
            await during
        await asyncio.gather(*(self.ask("after") for _ in range(8)))
        await self.close()
        return result

    def assert_switched_to(self, new: int) -> None:
        """No call sent after the first answer from step `new` was answered by an older step, and the eight calls
        after the train call all were answered by `new`."""
        first_new = min(answered for _, answered, step in self.seen if step == new)
        older = [step for sent, _, step in self.seen if sent > first_new and step < new]
        assert older == [], f"steps {sorted(set(older))} answered after step {new} had"
        assert [step for _, _, step in self.seen[-8:]] == [new] * 8

    async def close(self) -> None:
        await self.client.close()

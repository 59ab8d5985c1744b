"""A server killed with SIGKILL in the middle of a step, with a trainer node attached: a restart on the same art path
serves the last committed step, and the node (never restarted) rejoins the group so a further step trains.

The server is `art-agents serve` as `LocalBackend` starts it (its own process), training on 2 "nodes" of one rank
each on loopback (gloo): node 0 is the server's own trainer process, node 1 `art-agents trainer-node` started as a
launcher would (examples/multi-node/node.sh) and left running throughout.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from server_fixtures import free_port
from test_trainer_nodes import Node

from art_agents import ModelConfig, TrainableModel, Trajectory, TrajectoryGroup
from art_agents.backends.local import LocalBackend
from art_agents.errors import ArtError
from art_agents.train_config import TrainConfig
from art_agents.trajectory import Turn

STEP = TrainConfig(learning_rate=1e-3, micro_batch_size=1)  # one micro-batch a sequence: a step reports progress


async def groups_of(model: TrainableModel, count: int = 8) -> list[TrajectoryGroup]:
    """`count` completions from the served model in groups of 4, rewarded 0 to 3 so every group has a spread."""
    client = model.openai_client()
    trajectories = []
    for i in range(count):
        messages = [{"role": "user", "content": f"question {i}"}]
        answer = await client.chat.completions.create(model=model.name, messages=messages, max_tokens=4)  # type: ignore[arg-type]
        text = answer.choices[0].message.content or ""
        trajectories.append(
            Trajectory(
                messages=[*messages, {"role": "assistant", "content": text}],
                turns=[Turn(index=1, completion_id=answer.id)],
                reward=float(i % 4),
            )
        )
    await client.close()
    return [TrajectoryGroup(trajectories[i : i + 4]) for i in range(0, count, 4)]


async def kill_mid_step(backend: LocalBackend, model: TrainableModel) -> None:
    """Start a step and SIGKILL the server at its first progress event (rank 0 has trained a micro-batch)."""
    assert backend._process is not None
    seen: list[str] = []
    try:
        async for event in backend.train_events(model, await groups_of(model), STEP):
            seen.append(event.type)
            backend._process.kill()  # SIGKILL, once (a no-op for a process already reaped)
            backend._process.wait()
    except (httpx.HTTPError, ArtError) as exc:  # the train stream breaks with the server
        seen.append(type(exc).__name__)
    # killed mid-step: it had started (progress events already on their way may follow), and never finished
    assert seen[0] == "progress" and "result" not in seen and seen[-1] != "progress", seen
    assert backend._process.returncode == -signal.SIGKILL


def wait_gone(pids: list[int], timeout_s: float = 60.0) -> list[int]:
    """The pids still running after up to `timeout_s` (zombies count as gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


@pytest.fixture
def waiting_node(tmp_path: Path) -> Iterator[tuple[str, Node]]:
    """The rendezvous address, and node 1 waiting there for the server's store, stopped whatever the test does."""
    rendezvous = f"127.0.0.1:{free_port()}"
    waiting = Node(rendezvous, 1, tmp_path / "node1", tmp_path / "art")
    try:
        yield rendezvous, waiting
    finally:
        waiting.process.terminate()  # the node stops its ranks
        waiting.process.wait(30)


@pytest.mark.slow  # about a minute on a quiet machine: the group is formed twice
async def test_a_server_killed_mid_step_restarts_at_its_last_step_and_the_node_rejoins(
    tiny_model_path: Path, tmp_path: Path, waiting_node: tuple[str, Node]
) -> None:
    (rendezvous, node1), art = waiting_node, tmp_path / "art"
    config = ModelConfig(trainer_processes=1, trainer_nodes=2, trainer_rendezvous=rendezvous)
    model = TrainableModel(name="agent", project="kill", base_model=str(tiny_model_path), config=config)
    first = LocalBackend(art)
    try:
        await model.register(first)
        assert (await model.train(await groups_of(model), STEP, progress=False)).step == 1
        first_ranks = node1.rank_pids()
        assert first_ranks  # node 1 joined the group
        assert first._process is not None
        trainers = [child.pid for child in psutil.Process(first._process.pid).children(recursive=True)]
        await kill_mid_step(first, model)
    finally:
        await first.close()
    assert wait_gone(trainers) == []  # the killed server's trainer process does not outlive it
    second = LocalBackend(art)
    try:
        await model.register(second)
        assert await model.get_step() == 1  # the step that was training when the server died is not committed
        client = model.openai_client()
        answer = await client.chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        await client.close()
        assert answer.model == "agent@1"
        assert node1.process.poll() is None  # the node was not restarted: the same process rejoins
        result = await asyncio.wait_for(model.train(await groups_of(model), STEP, progress=False), 600)
        assert result.step == 2 and await model.get_step() == 2
        assert node1.rank_pids() and set(node1.rank_pids()).isdisjoint(first_ranks)  # a new group, node 1 in it
    finally:
        await second.close()

"""A train call its caller cancels (`asyncio.wait_for`) closes its response stream: nothing is printed on the
client's stderr (no "Task exception was never retrieved", no "aclose(): asynchronous generator is already
running", no unclosed socket), the server closes its side at once and logs no error, and the next train call
trains. For RemoteBackend against a real server on loopback, and for LocalBackend with its own server process."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The client alone in a process of its own, so that its stderr is only its own. A step of 4 groups x 2 rollouts,
# one sequence per micro-batch, 30 passes: seconds, well past the 1 s the caller waits.
CLIENT = """
import asyncio, gc, sys
import art_agents as art

async def groups(model, n):
    client = model.openai_client()
    out = []
    for _ in range(n):
        trajectories = []
        for reward in (0.0, 1.0):
            async with art.rollout() as trajectory:
                messages = [{"role": "user", "content": "Say yes."}]
                await client.chat.completions.create(model=model.name, messages=messages, max_tokens=8)
                trajectory.reward = reward
            trajectories.append(trajectory)
        out.append(art.TrajectoryGroup(trajectories))
    await client.close()
    return out

async def main(where, base_model):
    backend = art.LocalBackend(where) if where.startswith("/") else art.RemoteBackend(where)
    model = art.TrainableModel(name="cancelled", project="tests", base_model=base_model)
    await model.register(backend)
    first, second = await groups(model, 4), await groups(model, 1)
    try:
        await asyncio.wait_for(model.train(first, art.TrainConfig(micro_batch_size=1, num_iterations=30)), 1.0)
    except asyncio.TimeoutError:
        print("cancelled", flush=True)
    gc.collect()
    await asyncio.sleep(0.5)
    result = await model.train(second, art.TrainConfig(max_staleness=1))
    print(f"then step {result.step}", flush=True)
    await backend.close()

asyncio.run(main(sys.argv[1], sys.argv[2]))
gc.collect()
"""


def cancel_then_train(where: str, tiny_model_path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    return subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", str(script), where, str(tiny_model_path)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "ART_AGENTS_PROGRESS": "0"},
    )  # fmt: skip


def assert_cancelled_quietly_and_trained_on(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines() == ["cancelled", "then step 2"]  # the cancelled step completes on the server


def test_a_cancelled_train_call_over_http_prints_nothing_and_the_server_trains_on(
    server_url: str, tiny_model_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):  # the server runs in this process
        assert_cancelled_quietly_and_trained_on(cancel_then_train(server_url, tiny_model_path, tmp_path))
    messages = [(r.name, r.getMessage()) for r in caplog.records]
    closed = messages.index(("art_agents.server", next(m for _, m in messages if "closed early" in m)))
    trained = next(i for i, (_, m) in enumerate(messages) if m.startswith("cancelled trained (rl): step 1"))
    assert closed < trained  # the server closed its stream when the client went, not when the step ended
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.name == "asyncio"]


@pytest.mark.slow  # a server process of its own: about 20 s
def test_a_cancelled_train_call_on_a_local_backend_prints_nothing_and_the_server_trains_on(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    art_path = tmp_path / "art"
    assert_cancelled_quietly_and_trained_on(cancel_then_train(str(art_path), tiny_model_path, tmp_path))
    log = (art_path / "server.log").read_text()
    assert "train stream of cancelled closed early" in log
    assert "Traceback" not in log and "never retrieved" not in log

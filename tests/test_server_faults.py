"""Faults: kill -9 while completions are being recorded and while a checkpoint is written; two train
calls at once. What was acknowledged survives, and the last good step keeps serving."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
from server_fixtures import start_server
from test_server_admin import MESSAGES, register, trajectory

from art_agents.backends.local import LocalBackend
from art_agents.model import TrainableModel
from art_agents.server.storage.checkpoints import latest_step, list_checkpoints
from art_agents.server.storage.token_store import TokenStore


async def test_kill_9_while_completions_are_recorded_loses_nothing_acknowledged(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    art_path = tmp_path / "art"
    model = TrainableModel(name="busy", project="faults", base_model=str(tiny_model_path))
    backend = LocalBackend(art_path)
    acknowledged: list[str] = []
    try:
        await model.register(backend)
        client = model.openai_client(max_retries=0)

        async def keep_asking() -> None:
            while True:
                answer = await client.chat.completions.create(model="busy", messages=MESSAGES, max_tokens=4, n=2)
                acknowledged.extend(c.completion_id for c in answer.choices)  # type: ignore[attr-defined]

        workers = [asyncio.create_task(keep_asking()) for _ in range(8)]
        while len(acknowledged) < 40:
            await asyncio.sleep(0.05)
        os.kill(backend._process.pid, signal.SIGKILL)  # type: ignore[union-attr]
        await asyncio.gather(*workers, return_exceptions=True)
        await client.close()
    finally:
        await backend.close()
    store = TokenStore(art_path / "faults" / "models" / "busy" / "tokens" / "store.sqlite")
    found = store.get_many(acknowledged)
    assert len(acknowledged) >= 40 and set(found) == set(acknowledged)  # every id a client got is on disk


def test_kill_9_during_a_checkpoint_save_leaves_the_previous_step(tmp_path: Path, tiny_model_path: Path) -> None:
    model_dir = tmp_path / "m"
    script = textwrap.dedent(f"""
        import sys, time
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM
        from art_agents.server.storage import checkpoints
        model = get_peft_model(AutoModelForCausalLM.from_pretrained({str(tiny_model_path)!r}),
                               LoraConfig(r=4, target_modules=["q_proj"]))
        checkpoints.save_checkpoint({str(model_dir)!r}, 0, model, None, {{}})
        def stall(folder):  # the adapter is written, the rename has not happened
            print("writing", flush=True)
            time.sleep(60)
        checkpoints._fsync_tree = stall
        checkpoints.save_checkpoint({str(model_dir)!r}, 1, model, None, {{}})
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "writing"
    child.kill()
    child.wait(timeout=30)
    temps = [p.name for p in (model_dir / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    assert temps  # the half-written checkpoint is there, under a temp name
    assert latest_step(model_dir) == 0 and [c.step for c in list_checkpoints(model_dir)] == [0]


def group_of(answers: list[dict]) -> dict:
    return {
        "trajectories": [
            trajectory(a["id"], float(reward), a["choices"][0]["message"]["content"])
            for a, reward in zip(answers, (0, 1), strict=True)
        ]
    }


async def test_two_train_calls_at_once_run_one_after_the_other(tiny_model_path: Path, tmp_path: Path) -> None:
    with start_server(tmp_path / "art") as url:
        assert register(url, "pair", tiny_model_path).status_code == 200
        async with httpx.AsyncClient(timeout=300) as client:
            answers = [
                (await client.post(f"{url}/v1/chat/completions",
                                   json={"model": "pair", "messages": MESSAGES, "max_tokens": 4, "seed": s})).json()
                for s in range(4)
            ]  # fmt: skip
            groups = [[group_of(answers[:2])], [group_of(answers[2:])]]
            body = {"config": {"learning_rate": 1e-3, "num_iterations": 3, "max_staleness": 1}}
            started = time.perf_counter()
            first, second = await asyncio.gather(
                *(client.post(f"{url}/v1/art/models/pair/train", json={**body, "groups": g}) for g in groups)
            )
        results = [json.loads(r.text.splitlines()[-1]) for r in (first, second)]
        assert sorted(r["result"]["step"] for r in results) == [1, 2], results
        history = (tmp_path / "art" / "tests" / "models" / "pair" / "history.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in history] == [1, 2]  # one after the other, never interleaved
        assert time.perf_counter() - started < 300

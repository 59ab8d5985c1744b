"""One process owns a model folder, a step is never written twice, train input is checked against the
model's context and for duplicates, and a full disk is named. After each refusal the server still trains."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
from server_fixtures import start_server
from test_server_admin import MESSAGES, register, train, trajectory


def sampled_group(url: str, name: str, seeds: tuple[int, int] = (1, 2)) -> dict[str, Any]:
    """A group of two completions this server sampled, rewarded 0 and 1."""
    answers = [
        httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": name, "messages": MESSAGES, "max_tokens": 4, "seed": seed},
            timeout=60,
        ).json()
        for seed in seeds
    ]
    return {
        "trajectories": [
            trajectory(a["id"], float(reward), a["choices"][0]["message"]["content"])
            for a, reward in zip(answers, (0, 1), strict=True)
        ]
    }


def result_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()][-1]


def trains(url: str, name: str, step: int) -> None:
    """The server still samples and trains: one more step on fresh completions."""
    last = result_of(train(url, name, [sampled_group(url, name)], learning_rate=1e-3))
    assert last["type"] == "result" and last["result"]["step"] == step, last


def test_a_second_server_on_a_model_folder_is_refused_naming_the_owner(tmp_path: Path, tiny_model_path: Path) -> None:
    art = tmp_path / "art"
    model_dir = art / "tests" / "models" / "m"
    with start_server(art) as first:
        assert register(first, "m", tiny_model_path, lora_rank=4).status_code == 200
        with start_server(art) as second:  # reopening the folder at start-up is skipped, with a log line
            assert httpx.get(f"{second}/health").json()["models"] == {}
            refused = register(second, "m", tiny_model_path, lora_rank=4)
            assert refused.status_code == 409, refused.text
            detail = refused.json()["detail"]
            assert f"pid {os.getpid()} on host {socket.gethostname()}" in detail and "\n" not in detail
        trains(first, "m", 1)
    assert not (model_dir / "server.lock").exists()  # released on close
    with start_server(art) as again:  # a closed owner hands the folder on
        assert register(again, "m", tiny_model_path, lora_rank=4).json()["step"] == 1


def test_a_lock_left_by_a_killed_owner_is_taken_over(tmp_path: Path, tiny_model_path: Path) -> None:
    art = tmp_path / "art"
    model_dir = art / "tests" / "models" / "m"
    holder = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from art_agents.server.folder_lock import lock_folder
        lock_folder(Path({str(model_dir)!r}))
        print("locked", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "locked"
    with start_server(art) as url:
        refused = register(url, "m", tiny_model_path, lora_rank=4)
        assert refused.status_code == 409 and f"pid {child.pid} " in refused.json()["detail"], refused.text
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        assert json.loads((model_dir / "server.lock").read_text())["pid"] == child.pid  # stale, left behind
        assert register(url, "m", tiny_model_path, lora_rank=4).status_code == 200
        assert json.loads((model_dir / "server.lock").read_text())["pid"] == os.getpid()
        trains(url, "m", 1)


def test_a_checkpoint_never_overwrites_an_existing_step(tmp_path: Path, tiny_model_path: Path) -> None:
    art = tmp_path / "art"
    model_dir = art / "tests" / "models" / "m"
    with start_server(art) as url:
        assert register(url, "m", tiny_model_path, lora_rank=4).status_code == 200
        intruder = model_dir / "checkpoints" / "0001"
        intruder.mkdir()
        (intruder / "trainer_state.json").write_text('{"by": "another writer"}')
        failed = result_of(train(url, "m", [sampled_group(url, "m")], learning_rate=1e-3))
        assert failed["type"] == "error" and "already exists and is never overwritten" in failed["error"], failed
        assert (intruder / "trainer_state.json").read_text() == '{"by": "another writer"}'
        assert httpx.get(f"{url}/v1/art/models/m/step").json() == {"step": 0}
        assert not (model_dir / "history.jsonl").exists()
        assert not (model_dir / "trajectories" / "train" / "0001.jsonl").exists()
        (intruder / "trainer_state.json").unlink()
        intruder.rmdir()
        trains(url, "m", 1)

"""One process owns a model folder, a step is never written twice, train input is checked against the
model's context and for duplicates, and a full disk is named. After each refusal the server still trains."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
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


def step_of(url: str) -> int:
    return int(httpx.get(f"{url}/v1/art/models/m/step").json()["step"])


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
        from art_agents.server.storage.folder_lock import lock_folder
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


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Iterator[str]:
    with start_server(tmp_path_factory.mktemp("art")) as base_url:
        assert register(base_url, "m", tiny_model_path, lora_rank=4).status_code == 200
        yield base_url


def retokenized(user: str, trajectory_id: str) -> dict[str, Any]:
    """A trajectory whose turn has no completion id, so the server renders it through the chat template."""
    return {
        "id": trajectory_id,
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "yes"}],
        "turns": [{"index": 1}],
    }


def test_sequences_longer_than_the_context_are_refused_naming_the_turn(url: str) -> None:
    huge = {"trajectories": [{**retokenized("word " * 400_000, "t-huge"), "reward": r} for r in (0.0, 1.0)]}  # 2 MB
    started = time.process_time()  # the server's thread is in this process
    response = train(url, "m", [huge])
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert "'t-huge', turn at history 0 message 1" in detail and "bytes" in detail and "4096 tokens" in detail
    assert time.process_time() - started < 3  # refused before the chat template; main spent 7 s on it, then a 500
    long = {"trajectories": [{**retokenized("ab " * 4050, f"t-long{r:.0f}"), "reward": r} for r in (0.0, 1.0)]}
    detail = train(url, "m", [long]).json()["detail"]  # ~8,100 tokens: main trained on it silently
    assert "'t-long0', turn at history 0 message 1: its sequence is 81" in detail and "4096 tokens" in detail, detail
    step = step_of(url)
    truncated = result_of(train(url, "m", [long], truncate_to_context=True))
    assert truncated["type"] == "result", truncated
    assert truncated["result"]["metrics"]["turns_truncated"] == 2 and truncated["result"]["step"] == step
    trains(url, "m", step + 1)


def test_a_completion_trained_twice_in_one_call_is_refused(url: str) -> None:
    group = sampled_group(url, "m")
    twice = {**group["trajectories"][0], "id": "t0"}
    duplicated = {"trajectories": [{**twice, "reward": 0.0}, {**twice, "reward": 5.0}]}
    response = train(url, "m", [duplicated])
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    cid = twice["turns"][0]["completion_id"]
    assert f"{cid!r} in groups[0].trajectories[0] (id 't0') and groups[0].trajectories[1] (id 't0')" in detail
    across = train(url, "m", [group, {"trajectories": [dict(t) for t in group["trajectories"]]}])
    assert across.status_code == 400 and "groups[1].trajectories[0]" in across.json()["detail"], across.text
    trains(url, "m", step_of(url) + 1)


def test_a_reward_sent_as_text_is_refused(url: str) -> None:
    group = sampled_group(url, "m")
    group["trajectories"][1]["reward"] = "0.5"
    response = train(url, "m", [group])
    assert response.status_code == 400, response.text
    assert "reward must be a number, got the string '0.5'" in response.json()["detail"]


def test_a_full_disk_is_named_for_completions_and_train_steps(
    tmp_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_agents.server.storage import checkpoints
    from art_agents.server.storage.token_store import TokenStore

    insert = TokenStore._insert

    def full_store(self: TokenStore, rows: list[tuple]) -> None:
        """The real insert on a database that may not grow: SQLite itself answers SQLITE_FULL (and rolls back)."""
        size = self._db.execute("PRAGMA page_count").fetchone()[0]
        self._db.execute(f"PRAGMA max_page_count = {size}")
        try:  # the rows and copies under other ids, more than the free room in the pages there are
            insert(self, rows + [(f"{row[0]}-{i}", *row[1:]) for i in range(500) for row in rows])
        finally:
            self._db.execute("PRAGMA max_page_count = 1073741823")

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "history.jsonl")

    art = tmp_path / "art"
    model_dir = art / "tests" / "models" / "m"
    with start_server(art) as url:
        assert register(url, "m", tiny_model_path, lora_rank=4).status_code == 200
        group = sampled_group(url, "m")
        with monkeypatch.context() as patch:
            patch.setattr(TokenStore, "_insert", full_store)
            body = {"model": "m", "messages": MESSAGES, "max_tokens": 4}
            full = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert full.status_code == 507 and full.json()["detail"].startswith("the server's disk is full"), full.text
            with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}) as stream:
                assert "the server's disk is full" in stream.read().decode()
            patch.setattr(checkpoints, "append_history", full_disk)  # after the checkpoint is written
            failed = result_of(train(url, "m", [group], learning_rate=1e-3))
        assert failed["type"] == "error" and failed["error"].startswith("the server's disk is full"), failed
        assert [p.name for p in (model_dir / "checkpoints").iterdir()] == ["0000"]  # nothing half-written
        assert not (model_dir / "trajectories" / "train" / "0001.jsonl").exists()
        assert step_of(url) == 0
        trains(url, "m", 1)  # the store and the trainer work again once there is room

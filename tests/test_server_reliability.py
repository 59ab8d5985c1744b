"""One bad request never hurts another, everything is bounded, and the API refuses what it cannot honour."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import start_server
from test_server_admin import MESSAGES, register, train, trajectory

from art_agents.server.engines.protocol import SamplingParams
from art_agents.server.engines.stream_text import IncrementalDecoder
from art_agents.server.engines.transformers_engine import TransformersEngine
from art_agents.train_config import ModelConfig


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Iterator[str]:
    with start_server(tmp_path_factory.mktemp("art")) as base_url:
        assert register(base_url, "m", tiny_model_path).status_code == 200
        yield base_url


def chat(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **body}, timeout=60)


@pytest.mark.parametrize(
    ("field", "value"),
    [("top_k", 5), ("presence_penalty", 0.5), ("frequency_penalty", -1.0), ("logit_bias", {"5": 10}),
     ("response_format", {"type": "json_object"}), ("tool_choice", "required"),
     ("tool_choice", {"type": "function", "function": {"name": "f"}}), ("seed", 2**70), ("stop", ["a"] * 5),
     ("stop", "x" * 300), ("top_logprobs", 3)],
)  # fmt: skip
def test_what_the_server_cannot_honour_is_a_400_naming_it(url: str, field: str, value: Any) -> None:
    response = chat(url, **{field: value}, max_tokens=2)
    assert response.status_code == 400, response.text
    assert field in response.json()["detail"] or "stop strings" in response.json()["detail"]


def test_neutral_values_of_unsupported_fields_are_fine(url: str) -> None:
    response = chat(url, presence_penalty=0, frequency_penalty=0.0, response_format={"type": "text"}, max_tokens=2,
                    seed=2**63 - 1, tool_choice="auto")  # fmt: skip
    assert response.status_code == 200, response.text


def test_a_huge_message_is_refused_at_once_and_health_keeps_answering(url: str) -> None:
    answers: list[float] = []
    stop = threading.Event()

    def watch_health() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            httpx.get(f"{url}/health", timeout=30)
            answers.append(time.perf_counter() - started)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch_health)
    watcher.start()
    started = time.process_time()  # the server's thread is in this process
    response = chat(url, messages=[{"role": "user", "content": "x " * 15_000_000}])  # 30 MB
    cpu_s = time.process_time() - started
    stop.set()
    watcher.join()
    assert response.status_code == 400 and "cannot fit the model's context" in response.json()["detail"]
    assert cpu_s < 20 and max(answers) < 30  # main took ~3 minutes and froze /health meanwhile


def test_unknown_and_older_steps(url: str, tiny_model_path: Path) -> None:
    assert register(url, "steps", tiny_model_path).status_code == 200
    prompt = {"model": "steps", "messages": MESSAGES, "temperature": 0, "max_tokens": 6}
    before = httpx.post(f"{url}/v1/chat/completions", json=prompt, timeout=60).json()
    assert before["model"] == "steps@0"
    sampled = [httpx.post(f"{url}/v1/chat/completions", json={**prompt, "temperature": 1.0}, timeout=60).json()
               for _ in range(4)]  # fmt: skip
    groups = [{"trajectories": [trajectory(r["choices"][0]["completion_id"], float(k), r["choices"][0]["message"]["content"])
                                for k, r in enumerate(sampled)]}]  # fmt: skip
    assert train(url, "steps", groups, learning_rate=0.5).status_code == 200

    missing = httpx.post(f"{url}/v1/chat/completions", json={**prompt, "model": "steps@999"}, timeout=60)
    assert missing.status_code == 404 and "no step 999" in missing.json()["detail"]
    latest = httpx.post(f"{url}/v1/chat/completions", json=prompt, timeout=60).json()
    base = httpx.post(f"{url}/v1/chat/completions", json={**prompt, "model": "steps@0"}, timeout=60).json()
    assert latest["model"] == "steps@1" and base["model"] == "steps@0"
    assert base["choices"][0]["token_ids"] == before["choices"][0]["token_ids"]  # the base policy, not step 1
    assert base["choices"][0]["logprobs"] == before["choices"][0]["logprobs"]
    again = httpx.post(f"{url}/v1/chat/completions", json=prompt, timeout=60).json()
    assert again["model"] == "steps@1" and again["choices"][0]["token_ids"] == latest["choices"][0]["token_ids"]

    deleted = httpx.post(f"{url}/v1/art/models/steps/checkpoints/delete", json={"steps": [0]}, timeout=60)
    assert deleted.status_code == 200
    gone = httpx.post(f"{url}/v1/chat/completions", json={**prompt, "model": "steps@0"}, timeout=60)
    assert gone.status_code == 404 and "was deleted" in gone.json()["detail"]


def test_names_are_matched_in_full_and_hosts_checked(url: str, tiny_model_path: Path) -> None:
    assert register(url, "m\n", tiny_model_path).status_code == 400
    evil = httpx.get(f"{url}/v1/models", headers={"Host": "evil.example"}, timeout=10)
    assert evil.status_code == 400  # a DNS-rebinding page cannot reach the keyless loopback server
    assert httpx.get(f"{url}/v1/models", headers={"Host": "localhost"}, timeout=10).status_code == 200


def test_the_scripted_engine_is_not_public_and_errors_do_not_leak(tmp_path: Path, tiny_model_path: Path) -> None:
    from fastapi.testclient import TestClient

    from art_agents.server.http.app import create_app

    app = create_app(tmp_path / "art")

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret path /etc/shadow")

    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        body = {"name": "s", "project": "p", "base_model": str(tiny_model_path),
                "config": {"engine": "scripted", "scripted_responses": ["hi"]}}  # fmt: skip
        refused = client.post("/v1/art/models", json=body)
        assert refused.status_code == 400 and "test suite only" in refused.json()["detail"]
        failed = client.get("/boom")
        assert failed.status_code == 500 and "request id" in failed.json()["detail"]
        assert "secret" not in failed.text and "RuntimeError" not in failed.text


async def test_a_request_that_breaks_generation_fails_alone(tiny_model_path: Path) -> None:
    engine = TransformersEngine.load(str(tiny_model_path), ModelConfig())
    params = SamplingParams(max_tokens=4, seed=0)  # unseeded, an early end-of-turn token made this flaky
    outcomes = await asyncio.gather(
        engine.generate([5, 6, 7], params),
        engine.generate([5, 10**6], params),  # a token id outside the vocabulary
        engine.generate([8, 9], params),
        return_exceptions=True,
    )
    await engine.close()
    assert isinstance(outcomes[1], Exception)
    assert [len(o[0].token_ids) for o in (outcomes[0], outcomes[2])] == [4, 4]  # type: ignore[index]


async def test_a_full_queue_answers_503_with_retry_after(tmp_path: Path, tiny_model_path: Path) -> None:
    with start_server(tmp_path / "art") as base_url:
        assert register(base_url, "q", tiny_model_path, max_batch_size=1, max_queued_requests=1).status_code == 200
        async with httpx.AsyncClient(timeout=120) as client:
            body = {"model": "q", "messages": MESSAGES, "max_tokens": 48}
            responses = await asyncio.gather(
                *(client.post(f"{base_url}/v1/chat/completions", json=body) for _ in range(8))
            )
    busy = [r for r in responses if r.status_code == 503]
    assert busy and all(r.headers["retry-after"] == "1" for r in busy)
    assert all(r.status_code in (200, 503) for r in responses)


def test_incremental_decoding_gives_the_full_decode(tokenizer: Any) -> None:
    generator = random.Random(0)
    for _ in range(200):
        ids = [generator.randrange(len(tokenizer)) for _ in range(generator.randrange(1, 40))]
        decoder = IncrementalDecoder(tokenizer)
        pieces = "".join(decoder.push(token) for token in ids)
        full = tokenizer.decode(ids, skip_special_tokens=True)
        assert pieces == decoder.text
        assert full == decoder.text or (full.endswith("\ufffd") and full.startswith(decoder.text))  # a cut char waits


def test_history_is_appended_and_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    from art_agents.server.storage.checkpoints import append_history

    path = tmp_path / "history.jsonl"
    append_history(tmp_path, {"step": 1})
    with path.open("ab") as handle:
        handle.write(b'{"step": 2, "metr')  # a crash in the middle of writing row 2
    inode = path.stat().st_ino
    append_history(tmp_path, {"step": 2})
    assert path.read_text().splitlines() == ['{"step": 1}', '{"step": 2}']
    assert path.stat().st_ino == inode  # appended in place, not rewritten through a new file


def test_a_client_that_hangs_up_mid_stream_frees_the_engine(url: str) -> None:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 4000, "stream": True, "temperature": 0}  # ~40 s
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(4):
            next(lines)  # a few chunks, then the client goes away
    started = time.process_time()  # the engine's threads are in this process
    assert chat(url, max_tokens=4).status_code == 200
    assert time.process_time() - started < 10  # not queued behind the rest of 4000 tokens (~40 s of CPU)


def test_an_unauthenticated_body_is_refused_before_it_is_read(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from art_agents.server.http.app import create_app

    app = create_app(tmp_path / "art", api_key="secret", max_body_bytes=1000)
    with TestClient(app) as client:
        response = client.post("/v1/chat/completions", content=b"x" * 5000)
    assert response.status_code == 401  # not 413: nothing of the body was read for a stranger


def test_rollout_counts_and_tokens_of_deleted_steps_are_pruned(tmp_path: Path) -> None:
    from art_agents.server.serving.rollout_log import RolloutLog
    from art_agents.server.storage.token_store import TokenRecord, TokenStore
    from art_agents.wire import RolloutCall

    counts = RolloutLog(limit=2, kept_limit=2)
    for rollout_id in ("a", "b", "a", "c"):
        counts.add(rollout_id)
    assert (counts.get("a"), counts.get("b"), counts.get("c")) == (2, 0, 1)  # "b" was the least recent
    call = RolloutCall(protocol="messages", messages=[], message={"role": "assistant"}, completion_id="x", model="m@0")
    for rollout_id in ("k1", "k2", "k3"):  # calls are kept for at most kept_limit rollouts, the oldest forgotten
        counts.start_keeping(rollout_id)
        counts.add(rollout_id, call)
    assert [len(counts.record(r).calls) for r in ("k1", "k2", "k3")] == [0, 1, 1]
    assert len(counts.finish("k3").calls) == 1 and counts.record("k3").calls == []  # handed over once
    store = TokenStore(tmp_path / "store.sqlite")
    for step in (0, 1, 1, 2):
        store.add(TokenRecord(completion_id=f"c{step}-{store.count()}", model="m", policy_step=step, prompt_ids=[1],
                              completion_ids=[2], logprobs=[-0.5]))  # fmt: skip
    assert store.delete_steps([1]) == 2 and store.count() == 2


def test_base_models_come_from_the_hub_or_allowed_folders_only(tmp_path: Path, tiny_model_path: Path) -> None:
    from art_agents.server.errors import ServiceError
    from art_agents.server.models.model_sources import ModelSources

    anywhere = ModelSources.of(None)
    anywhere.check("/etc")  # the operator's own loopback server loads what it is given
    allowed = ModelSources.of([tiny_model_path.parent])
    allowed.check(str(tiny_model_path))
    allowed.check("Qwen/Qwen3-0.6B")
    refusals = []
    for outside in ("/etc", "/no/such/folder", str(tmp_path)):
        with pytest.raises(ServiceError) as refused:
            allowed.check(outside)
        refusals.append(refused.value.detail.replace(repr(outside), "X"))
    assert refused.value.status == 403 and len(set(refusals)) == 1  # the same answer whether the path exists or not
    assert "no such folder" in ModelSources.load_error(str(tmp_path / "missing"))
    assert "server log" in ModelSources.load_error("Org/not-cached-anywhere")


def test_a_client_that_gives_up_on_a_plain_request_frees_the_engine(url: str) -> None:
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{url}/v1/chat/completions", timeout=1.0,
                   json={"model": "m", "messages": MESSAGES, "max_tokens": 4000, "temperature": 0})  # fmt: skip
    time.sleep(0.5)  # the server notices the closed connection within a quarter of a second
    started = time.process_time()  # the engine's threads are in this process
    assert chat(url, max_tokens=4).status_code == 200
    assert time.process_time() - started < 10  # not queued behind the rest of 4000 tokens (~40 s of CPU)

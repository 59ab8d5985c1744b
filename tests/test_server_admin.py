"""Registration, training routes, restart, bad input and the bind/API-key rules of the real server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_fixtures import start_server

MESSAGES = [{"role": "user", "content": "Say yes."}]


def register(base_url: str, name: str, base_model: Path, **config: Any) -> httpx.Response:
    body = {"name": name, "project": "tests", "base_model": str(base_model), "config": config}
    return httpx.post(f"{base_url}/v1/art/models", json=body, timeout=120)


def trajectory(completion_id: str | None, reward: float, text: str = "yes") -> dict[str, Any]:
    return {
        "messages": [*MESSAGES, {"role": "assistant", "content": text}],
        "turns": [{"index": 1, "completion_id": completion_id}],
        "reward": reward,
    }


def train(base_url: str, name: str, groups: list[dict[str, Any]], **config: Any) -> httpx.Response:
    body = {"groups": groups, "config": config}
    return httpx.post(f"{base_url}/v1/art/models/{name}/train", json=body, timeout=120)


def test_train_serves_the_next_step_and_a_restart_reopens_everything(tmp_path: Path, tiny_model_path: Path) -> None:
    art = tmp_path / "art"
    with start_server(art) as url:
        assert register(url, "policy", tiny_model_path, lora_rank=4).json()["step"] == 0
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        answers = [
            client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=6, seed=s) for s in (1, 2)
        ]
        group = {
            "trajectories": [
                trajectory(a.id, float(r), a.choices[0].message.content) for a, r in zip(answers, (0, 1), strict=True)
            ]
        }
        body = {"groups": [group], "config": {"learning_rate": 1e-3}}
        lines, during = [], None
        with httpx.stream("POST", f"{url}/v1/art/models/policy/train", json=body, timeout=120) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                lines.append(json.loads(line))
                if during is None:  # training has started: this request must wait and get the new step
                    during = client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=2)
        assert during is not None and during.model == "policy@1"
        *progress, last = lines
        assert last["type"] == "result" and last["result"]["step"] == 1
        assert all(e["type"] == "progress" for e in progress)
        assert last["result"]["metrics"]["turns_from_store"] == 2
        assert httpx.get(f"{url}/v1/art/models/policy/step").json() == {"step": 1}
        after = client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=6, seed=1)
        assert after.model == "policy@1"
        assert [c["step"] for c in httpx.get(f"{url}/v1/art/models/policy/checkpoints").json()] == [0, 1]
    model_dir = art / "tests" / "models" / "policy"
    history = [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()]
    assert [row["step"] for row in history] == [1] and history[0]["config"]["learning_rate"] == 1e-3
    assert (model_dir / "trajectories" / "train" / "0001.jsonl").exists()

    with start_server(art) as url:  # a restart reopens the model, its step and its token store
        assert httpx.get(f"{url}/v1/art/models/policy/step").json() == {"step": 1}
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        again = client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=6, seed=1)
        assert again.model == "policy@1"
        assert again.choices[0].model_extra["token_ids"] == after.choices[0].model_extra["token_ids"]
        from art_agents.server.storage.token_store import TokenStore

        store = TokenStore(model_dir / "tokens" / "store.sqlite")
        assert store.count() == 5 and store.get(answers[0].id) is not None
        assert register(url, "policy", tiny_model_path).json()["step"] == 1  # re-registering reopens


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path):
    with start_server(tmp_path_factory.mktemp("art"), max_body_bytes=200_000) as url:
        assert register(url, "m", tiny_model_path).status_code == 200
        yield url


def assert_refused(response: httpx.Response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and "Traceback" not in detail
    for word in words:
        assert word in detail, detail


def test_unknown_or_unsafe_model_names_are_refused(small_server: str, tiny_model_path: Path) -> None:
    chat = {"messages": MESSAGES, "max_tokens": 2}
    assert_refused(
        httpx.post(f"{small_server}/v1/chat/completions", json={"model": "nope", **chat}), 404, "'nope'", "register"
    )
    assert_refused(httpx.post(f"{small_server}/v1/chat/completions", json={"model": "../m", **chat}), 400, "'/'")
    assert_refused(register(small_server, "a/b", tiny_model_path), 400, "'/'")
    assert_refused(register(small_server, "..", tiny_model_path), 400, "'..'")
    assert_refused(httpx.get(f"{small_server}/v1/art/models/nope/step"), 404, "not registered")
    assert_refused(register(small_server, "other", tiny_model_path / "missing"), 400, "no such folder")


def test_bad_training_input_is_refused(small_server: str) -> None:
    group = {"trajectories": [trajectory("chatcmpl-unknown", 0.0), trajectory("chatcmpl-unknown2", 1.0)]}
    assert_refused(train(small_server, "m", [group]), 400, "chatcmpl-unknown")
    assert_refused(train(small_server, "m", []), 400, "groups is empty")
    assert_refused(train(small_server, "m", [{"trajectories": []}]), 400, "no trajectories")
    nan_body = (
        '{"groups": [{"trajectories": ['
        + json.dumps(trajectory(None, 0.0)).replace('"reward": 0.0', '"reward": NaN')
        + "]}]}"
    )
    response = httpx.post(
        f"{small_server}/v1/art/models/m/train", content=nan_body, headers={"content-type": "application/json"}
    )
    assert_refused(response, 400, "reward")
    assert_refused(train(small_server, "m", [group], loss="nonsense"), 400, "loss")
    huge = {"trajectories": [trajectory(None, 0.0, "x" * 300_000)]}
    assert_refused(train(small_server, "m", [huge]), 413, "bytes")
    chunked = iter([json.dumps({"groups": [huge]}).encode()])  # no content-length: counted while read
    response = httpx.post(
        f"{small_server}/v1/art/models/m/train", content=chunked, headers={"content-type": "application/json"}
    )
    assert_refused(response, 413, "bytes")
    assert_refused(httpx.post(f"{small_server}/v1/chat/completions", content=b"{not json"), 400, "invalid request")
    assert httpx.get(f"{small_server}/v1/art/models/m/step").json() == {"step": 0}


def test_bad_completion_requests_are_refused(small_server: str) -> None:
    url = f"{small_server}/v1/chat/completions"
    assert_refused(httpx.post(url, json={"model": "m", "messages": []}), 400, "messages")
    assert_refused(httpx.post(url, json={"model": "m", "messages": MESSAGES, "temperature": -1}), 400, "temperature")
    assert_refused(httpx.post(url, json={"model": "m", "messages": MESSAGES, "n": 100}), 400, "max_batch_size")


def test_api_key_is_required_when_set(tmp_path: Path) -> None:
    with start_server(tmp_path / "art", api_key="s3cret") as url:
        assert httpx.get(f"{url}/health").status_code == 200
        assert_refused(httpx.get(f"{url}/v1/models"), 401, "API key")
        assert_refused(httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"}), 401, "API key")
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_non_loopback_bind_without_api_key_is_refused() -> None:
    from typer.testing import CliRunner

    from art_agents.cli.main import app, load_parts
    from art_agents.server.ops.cli import check_bind

    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("0.0.0.0", "key")
    with pytest.raises(ValueError, match="--api-key"):
        check_bind("0.0.0.0", None)
    load_parts()
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--port", "1"], env={"ART_AGENTS_API_KEY": ""})
    assert result.exit_code == 2
    assert "refusing to bind 0.0.0.0" in result.output


def test_a_failed_checkpoint_save_rolls_the_weights_back_to_the_last_good_step(
    tmp_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_agents.server.storage import checkpoints

    art = tmp_path / "art"
    greedy = {"model": "policy", "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "seed": 3}
    with start_server(art) as url:
        assert register(url, "policy", tiny_model_path, lora_rank=4).json()["step"] == 0
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")

        def logprobs() -> tuple[str, list[float]]:
            answer = client.chat.completions.create(**greedy)
            return answer.model, [t.logprob for t in answer.choices[0].logprobs.content]

        before = logprobs()
        answers = [
            client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=6, seed=s) for s in (1, 2)
        ]
        group = {
            "trajectories": [
                trajectory(a.id, float(r), a.choices[0].message.content) for a, r in zip(answers, (0, 1), strict=True)
            ]
        }

        def full_disk(*args: Any, **kwargs: Any) -> None:
            raise OSError(28, "No space left on device")

        with monkeypatch.context() as patch:
            patch.setattr(checkpoints, "save_checkpoint", full_disk)
            failed = train(url, "policy", [group], learning_rate=1e-2)
        assert failed.status_code == 200
        last = [json.loads(line) for line in failed.text.splitlines()][-1]
        assert last["type"] == "error", last
        assert "saving checkpoint 1 failed" in last["error"] and "No space left on device" in last["error"]
        assert "the last good checkpoint 0 keeps serving" in last["error"]
        assert httpx.get(f"{url}/v1/art/models/policy/step").json() == {"step": 0}
        assert logprobs() == before  # served as policy@0 with checkpoint 0's weights, not the trained ones
        assert [c["step"] for c in httpx.get(f"{url}/v1/art/models/policy/checkpoints").json()] == [0]
        model_dir = art / "tests" / "models" / "policy"
        assert not (model_dir / "history.jsonl").exists()
        assert not (model_dir / "trajectories" / "train" / "0001.jsonl").exists()

        retried = [json.loads(line) for line in train(url, "policy", [group], learning_rate=1e-2).text.splitlines()]
        assert retried[-1]["type"] == "result" and retried[-1]["result"]["step"] == 1
        model, trained = logprobs()
        assert model == "policy@1" and trained != before[1]  # the step does change the weights

"""OpenPipe reporting, received by a stand-in for OpenPipe's report route on loopback.

Training runs for real (`LocalBackend` serving the tiny model, rollouts through the OpenAI SDK with tools);
the stand-in keeps every body and Authorization header the reporter posts, or answers an error.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import uuid
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from scripted_openai import LoopbackServer
from server_fixtures import free_port

import art_agents as art
from art_agents.capture import record_completion, rollout
from art_agents.errors import ArtError
from art_agents.integrations import openpipe_reporting
from art_agents.integrations.openpipe_reporting import OpenPipeReporter, OpenPipeWarning
from art_agents.local import LocalBackend
from art_agents.report.reporters import StepRecord, create_reporters, reporter_names
from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG

KEY = f"opk-test-{uuid.uuid4().hex}"
REPORT = "/api/v1/report"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
        },
    }
]


class OpenPipeStandIn:
    """OpenPipe's report route on loopback: keeps what arrives, answers `status` (an error quoting the key)."""

    def __init__(self, status: int = 200) -> None:
        self.posts: list[dict[str, Any]] = []
        self.paths: set[str] = set()
        self.auth: set[str] = set()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                auth = self.headers.get("Authorization", "")
                stand_in.paths.add(self.path)
                stand_in.auth.add(auth)
                stand_in.posts.append(json.loads(body))
                failure = {"message": f"database is down (for {auth})"}  # an error that quotes the request's key
                answer = json.dumps({"status": "ok"} if status == 200 else failure).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = LoopbackServer(Handler)
        self.base_url = f"{self._server.url}/api/v1"

    def __enter__(self) -> OpenPipeStandIn:
        self._server.start(poll_interval=0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.close()


@pytest.fixture
def openpipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenPipeStandIn]:
    """OpenPipe's variables pointed at a stand-in that answers 200; nothing else reporting."""
    with OpenPipeStandIn() as stand_in:
        for name in ("ART_AGENTS_REPORT_TO", "LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("OPENPIPE_API_KEY", KEY)
        monkeypatch.setenv("OPENPIPE_BASE_URL", stand_in.base_url)
        yield stand_in


async def conversation(model: art.TrainableModel, reward: float) -> art.Trajectory:
    """Two model calls with a tool offered, the second after the first reply and a new user message."""
    client = model.openai_client()
    try:
        async with rollout() as trajectory:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "Say a."},
            ]
            for follow_up in ("Again.", None):
                reply = await client.chat.completions.create(
                    model=model.name, messages=messages, tools=TOOLS, max_tokens=8, temperature=1.0
                )
                text = reply.choices[0].message.content or ""
                messages += [{"role": "assistant", "content": text}]
                if follow_up:
                    messages += [{"role": "user", "content": follow_up}]
            trajectory.reward = reward
            trajectory.metrics["answer_chars"] = len(text)
    finally:
        await client.close()
    return trajectory


def ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, OpenPipeWarning)]


async def test_training_reports_every_model_call_with_its_reward(
    openpipe: OpenPipeStandIn, tiny_model_path: Path, tmp_path: Path
) -> None:
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    model = art.TrainableModel(
        name="op", project="tests", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG, report_to=["openpipe"]
    )
    await model.register(backend)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            group = await art.TrajectoryGroup(conversation(model, reward) for reward in (0.0, 0.5, 1.0))
            result = await model.train([group], progress=False)
        finally:
            await backend.close()  # waits for the reporter's posts
    assert not ours(caught)
    assert not result.skipped and result.step == 1

    assert openpipe.paths == {REPORT} and openpipe.auth == {f"Bearer {KEY}"}
    posts = {
        (p["reqPayload"]["metadata"]["trajectory_id"], p["reqPayload"]["metadata"]["turn"]): p for p in openpipe.posts
    }
    assert len(posts) == len(openpipe.posts) == 6  # 3 rollouts x 2 calls, each once
    for trajectory in group.trajectories:
        for number, turn in enumerate(trajectory.turns):
            post = posts[trajectory.id, str(number)]
            request, response = post["reqPayload"], post["respPayload"]
            assert request["messages"] == [m.wire() for m in trajectory.messages[: turn.index]]
            assert [m["role"] for m in request["messages"]] == ["system", "user"] + ["assistant", "user"] * number
            assert request["tools"] == TOOLS and request["model"] == response["model"] == "op@0"
            [choice] = response["choices"]
            assert (
                choice["message"] == trajectory.messages[turn.index].wire() and choice["message"]["role"] == "assistant"
            )
            assert response["id"] == turn.completion_id and response["usage"]["prompt_tokens"] > 0
            assert post["requestedAt"] == round(turn.started_at * 1000) <= post["receivedAt"]
            assert post["statusCode"] == 200
            metadata = request["metadata"]
            assert post["tags"] == metadata
            assert metadata == {
                "project": "tests",
                "model": "op",
                "split": "train",
                "step": "1",  # the checkpoint the step made, as in history.jsonl
                "group": "0",
                "trajectory_id": trajectory.id,
                "turn": str(number),
                "policy_step": "0",  # the checkpoint that sampled the call
                "reward": json.dumps(trajectory.reward),
                "answer_chars": str(trajectory.metrics["answer_chars"]),
            }
    assert sorted(p["reqPayload"]["metadata"]["reward"] for p in openpipe.posts) == [
        "0.0",
        "0.0",
        "0.5",
        "0.5",
        "1.0",
        "1.0",
    ]


@pytest.mark.parametrize("answer", ["closed port", "HTTP 500"])
async def test_a_dead_or_failing_openpipe_costs_one_warning_and_training_goes_on(
    answer: str, tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with OpenPipeStandIn(status=500) as failing:
        monkeypatch.setenv("OPENPIPE_API_KEY", KEY)
        dead = f"http://127.0.0.1:{free_port()}/api/v1"  # nothing listens there
        monkeypatch.setenv("OPENPIPE_BASE_URL", dead if answer == "closed port" else failing.base_url)
        backend = LocalBackend(path=tmp_path / ".art", in_process=True)
        model = art.TrainableModel(
            name="down", project="tests", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG,
            report_to=["openpipe"],
        )  # fmt: skip
        await model.register(backend)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                groups = [await art.TrajectoryGroup(conversation(model, reward) for reward in (0.0, 1.0))]
                trained = await model.train(groups, progress=False)
                logged = await model.log(groups, split="val")
            finally:
                await backend.close()
    assert (trained.step, logged.step) == (1, 1) and not trained.skipped
    [warning] = ours(caught)  # one for both steps, and none from close, which did not have to give up
    assert warning.startswith("OpenPipe: ") and "training goes on" in warning and KEY not in warning
    assert ("ConnectError" if answer == "closed port" else "HTTP 500 Internal Server Error") in warning
    if answer == "HTTP 500":
        assert "database is down (for Bearer <OPENPIPE_API_KEY>)" in warning and failing.auth == {f"Bearer {KEY}"}


def record_of(count: int) -> StepRecord:
    """A train step of `count` rollouts of one model call each, recorded as the capture layer does."""
    trajectories = []
    for n in range(count):
        with rollout() as trajectory:
            request = [{"role": "user", "content": f"question {n}"}]
            record_completion(request, {"role": "assistant", "content": "answer"}, model="m@3", latency_s=0.01)
        trajectories.append(trajectory)
    now = time.time()
    return StepRecord("train", 4, [art.TrajectoryGroup(trajectories)], {"loss": 0.5}, now - 1, now)


def test_a_host_that_never_answers_costs_one_timeout_per_step(
    openpipe: OpenPipeStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 calls, 8 at a time, would open 40 connections and wait 5 timeouts; the step is given up at the first."""
    monkeypatch.setattr(openpipe_reporting, "TIMEOUT_S", 3.0)  # close waits two: ample for one, not for five
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        monkeypatch.setenv("OPENPIPE_BASE_URL", f"http://127.0.0.1:{silent.getsockname()[1]}/api/v1")
        reporter = OpenPipeReporter(art.TrainableModel(name="silent", project="tests", base_model="unused"))
        step = record_of(40)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            started = time.monotonic()
            reporter.record(step)
            recorded_s = time.monotonic() - started
            reporter.close()
        silent.setblocking(False)
        connections = 0
        with contextlib.suppress(BlockingIOError):
            while True:  # the connections the kernel took for it, each one post
                silent.accept()[0].close()
                connections += 1
    assert recorded_s < openpipe_reporting.TIMEOUT_S  # queued for the reporter's thread, not posted meanwhile
    assert connections < 2 * openpipe_reporting.CONCURRENT_POSTS, connections  # the first few; the rest given up
    [warning] = ours(caught)  # the timeout; none from close, which did not have to give up
    assert "ReadTimeout" in warning and "train step 4" in warning and KEY not in warning


def test_a_refused_call_costs_one_warning_and_the_others_still_go(monkeypatch: pytest.MonkeyPatch) -> None:
    with OpenPipeStandIn(status=400) as refusing:
        monkeypatch.setenv("OPENPIPE_API_KEY", KEY)
        monkeypatch.setenv("OPENPIPE_BASE_URL", refusing.base_url)
        reporter = OpenPipeReporter(art.TrainableModel(name="refused", project="tests", base_model="unused"))
        with pytest.warns(OpenPipeWarning, match=r"refused a completion \(HTTP 400 Bad Request") as caught:
            reporter.record(record_of(5))
            reporter.close()
    assert len(refusing.posts) == 5 and len(ours(caught.list)) == 1


async def test_the_key_turns_it_on_and_without_it_nothing_is_sent(
    openpipe: OpenPipeStandIn, tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert reporter_names(None) == ["openpipe"]  # OPENPIPE_API_KEY alone turns it on
    assert reporter_names([]) == []  # an explicit list wins
    monkeypatch.delenv("OPENPIPE_API_KEY")
    explicit = art.TrainableModel(name="nokey", project="tests", base_model="unused", report_to=["openpipe"])
    with pytest.raises(ArtError, match="report_to='openpipe' needs OPENPIPE_API_KEY"):
        create_reporters(reporter_names(explicit.report_to), explicit)

    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    model = art.TrainableModel(name="quiet", project="tests", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG)
    await model.register(backend)
    try:
        assert model.reporters == []
        await model.log([await art.TrajectoryGroup(conversation(model, reward) for reward in (0.0, 1.0))])
    finally:
        await backend.close()
    assert openpipe.posts == []

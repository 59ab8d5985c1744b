"""Fixtures for tests that need the tiny model or a real art-agents server on loopback.

`tiny_model_path` builds the tiny model once per test session. `start_server(art_path)` runs the
real FastAPI app under uvicorn in a background thread on a free loopback port and yields its
base URL (without `/v1`); `server_url` is that for a fresh art path per test, `server` one per test file
(with `backend`, a client of it).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from art_agents.backends.remote import RemoteBackend
    from art_agents.model import TrainableModel
    from art_agents.server.storage.token_store import TokenStore

# An OpenAI tool the tests serve and train with.
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from art_agents.server.ops.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "qwen3")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path: Path) -> Any:
    """The tiny model's tokenizer (read-only, so one per session)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def store(tmp_path: Path) -> TokenStore:
    """An empty token store in this test's folder."""
    from art_agents.server.storage.token_store import TokenStore

    return TokenStore(tmp_path / "tokens" / "store.sqlite")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def start_server(art_path: str | Path, *, startup_timeout: float = 120.0, **app_options: Any) -> Iterator[str]:
    """Serve `art_path` on 127.0.0.1 in a thread; yields `http://127.0.0.1:PORT`; stops on exit.

    `app_options` go to `create_app` (`api_key`, `max_body_bytes`); the scripted test engine is allowed.
    """
    import uvicorn

    from art_agents.server.http.app import create_app

    app = create_app(Path(art_path), **{"test_engines": True, **app_options})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name=f"art-server-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the art-agents server on port {port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Iterator[str]:
    """One server for a whole test file, so the models its tests register load once."""
    with start_server(tmp_path_factory.mktemp("art")) as url:
        yield url


@pytest.fixture
async def backend(server: str) -> AsyncIterator[RemoteBackend]:
    """A client of the file's server, closed after the test."""
    from art_agents.backends.remote import RemoteBackend

    client = RemoteBackend(server)
    yield client
    await client.close()


@pytest.fixture
def server_url(tmp_path: Path) -> Iterator[str]:
    """A fresh server on an empty art path (`tmp_path / "art"`)."""
    with start_server(tmp_path / "art") as url:
        yield url


# A rollout module for job files and loops: one completion, rewarded by how often it writes a letter.
ROLLOUT_MODULE = """
import art_agents as art


async def attempt(model: art.TrainableModel, scenario: dict) -> art.Trajectory:
    client = model.openai_client()
    async with art.rollout(prompt=scenario["prompt"]) as trajectory:
        reply = await client.chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": scenario["prompt"]}], max_tokens=6, temperature=1.0
        )
        text = reply.choices[0].message.content or ""
        trajectory.reward = text.count(scenario["letter"]) / len(text) if text else 0.0
    await client.close()
    return trajectory
"""


def hermes(name: str, **arguments: Any) -> str:
    """A tool call as Qwen3/hermes text, for the server's scripted engine."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


async def scripted_model(backend: RemoteBackend, tiny_model_path: Path, name: str, texts: list[str]) -> TrainableModel:
    """A model registered on `backend` whose scripted engine answers `texts` in turn, as the tiny model's tokens."""
    from art_agents import ModelConfig, TrainableModel

    config = ModelConfig(engine="scripted", scripted_responses=texts, default_max_tokens=64)
    model = TrainableModel(name=name, project="tests", base_model=str(tiny_model_path), config=config)
    await model.register(backend)
    return model

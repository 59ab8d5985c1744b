"""A missing or refused API key of any LLM role is named at once, never retried, and leaves no run folder behind.

No key exists here and no provider can be reached: each test removes the provider's variable (OPENAI_API_KEY) and
uses real loopback endpoints, one of which refuses every key with 401 as a provider does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from autorl_fixtures import TASK
from ruler_fixtures import judge_params, make_group
from scripted_openai import LoopbackServer, ScriptedOpenAI

from art_agents.autorl.mcp_rl import MCPRLConfig, run_mcp_rl
from art_agents.llm import KeyProblem
from art_agents.ruler import RulerError, ruler_score_group

ENV_WITHOUT_KEY = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}


class RefusingEndpoint:
    """An OpenAI-compatible endpoint that answers every request 401, as a provider does for a wrong key."""

    def __init__(self) -> None:
        self.requests = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                endpoint.requests += 1
                payload = json.dumps(
                    {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}
                ).encode()
                self.send_response(401)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = LoopbackServer(Handler)
        self.base_url = f"{self._server.url}/v1"
        self._server.start()

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def refusing() -> Iterator[RefusingEndpoint]:
    endpoint = RefusingEndpoint()
    yield endpoint
    endpoint.close()


@pytest.fixture
def no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "art_agents", *args],
        capture_output=True, text=True, timeout=120, env={**ENV_WITHOUT_KEY, "TMPDIR": str(tmp_path)},
    )  # fmt: skip


def test_the_readme_commands_without_a_key_stop_in_one_line_naming_the_variable_and_flag(tmp_path: Path) -> None:
    out = tmp_path / "bikeshop-run"
    result = cli("autorl", "--task", TASK, "--base-model", "Qwen/Qwen3-0.6B", "--judge-model",
                 "openai/gpt-4.1-mini", "--steps", "20", "--out", str(out), tmp_path=tmp_path)  # fmt: skip
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: judge 'openai/gpt-4.1-mini' needs an API key: set OPENAI_API_KEY, or pass --judge-api-key"
    ]
    assert not out.exists()  # nothing generated, nothing written: the check came first

    with ScriptedOpenAI() as judge:  # a judge on its own endpoint needs no key; the generator named apart does
        out = tmp_path / "time-run"
        result = cli("mcp-rl", "--server", "uvx mcp-server-time", "--base-model", "x", "--judge-model", "openai/j",
                     "--judge-api-base", judge.base_url, "--generator-model", "openai/gpt-4.1", "--out", str(out),
                     tmp_path=tmp_path)  # fmt: skip
        assert judge.requests == []
    assert result.stderr.splitlines() == [
        "error: generator 'openai/gpt-4.1' needs an API key: set OPENAI_API_KEY, or pass --generator-api-key"
    ]
    assert result.returncode == 1 and not out.exists()


async def test_an_sft_teacher_on_openai_without_a_key_is_named_before_anything_starts(
    tmp_path: Path, no_key: None
) -> None:
    config = MCPRLConfig(
        server="no-such-mcp-server-command", base_model="x", out=tmp_path / "run", sft_warmup=2, teacher_model="big"
    )
    with pytest.raises(KeyProblem) as raised:
        await run_mcp_rl(config, reward=lambda scenario, trajectory: 1.0, scenarios=["What time is it?"])
    assert str(raised.value) == (
        "the SFT warmup's teacher 'big' needs an API key: set OPENAI_API_KEY, or pass --teacher-api-key "
        "(or --teacher-api-base for another endpoint)"
    )
    assert not (tmp_path / "run").exists()


async def test_ruler_names_a_missing_key_at_once_even_when_dropping_failed_groups(no_key: None) -> None:
    for swallow in (False, True):  # a key problem fails every group: dropping them would hide it
        with pytest.raises(RulerError) as raised:
            await ruler_score_group(
                make_group([0.2, 0.8]), "openai/gpt-4.1-mini", cache_dir=None, swallow_exceptions=swallow
            )
        assert str(raised.value) == (
            "judge 'openai/gpt-4.1-mini' needs an API key: set OPENAI_API_KEY, or pass api_key"
        )


async def test_a_judge_at_a_local_api_base_needs_no_key(scripted: ScriptedOpenAI, no_key: None) -> None:
    from ruler_fixtures import judge_by_quality

    scripted.default = judge_by_quality
    params = {k: v for k, v in judge_params(scripted).items() if k != "api_key"}
    scored = await ruler_score_group(make_group([0.2, 0.8]), **params)
    assert scored is not None and [t.reward for t in scored.trajectories] == [0.2, 0.8]


async def test_a_refused_key_is_named_401_and_never_asked_again(refusing: RefusingEndpoint) -> None:
    params = {"api_base": refusing.base_url, "api_key": "sk-wrong", "cache_dir": None}
    for swallow in (False, True):
        with pytest.raises(RulerError) as raised:
            await ruler_score_group(make_group([0.2, 0.8]), "openai/judge", swallow_exceptions=swallow, **params)
        message = str(raised.value)
        assert message.startswith("judge 'openai/judge' refused the API key (401 authentication error)")
        assert "could not be reached" not in message and "more time" not in message
    assert refusing.requests == 2  # one request per call: a refused key is not retried


def test_a_refused_generator_key_stops_autorl_saying_what_was_saved(tmp_path: Path, refusing: RefusingEndpoint) -> None:
    out = tmp_path / "run"
    result = cli("autorl", "--task", TASK, "--base-model", "x", "--judge-model", "openai/judge", "--judge-api-base",
                 refusing.base_url, "--judge-api-key", "sk-wrong", "--out", str(out), tmp_path=tmp_path)  # fmt: skip
    assert result.returncode == 1 and refusing.requests == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: generator 'openai/judge' refused the API key (401 authentication error)")
    saved = sorted(p.name for p in out.iterdir())
    assert f"; saved in {out}: {', '.join(saved)} (details: " in line and "nothing was saved" not in line
    assert "could not be reached" not in line and "more time" not in line


def test_the_email_example_names_the_judge_key_before_it_builds_or_loads_anything(tmp_path: Path) -> None:
    script = Path(__file__).parents[1] / "examples" / "email_search" / "train.py"
    result = subprocess.run(
        [sys.executable, str(script), "--tiny"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={k: v for k, v in ENV_WITHOUT_KEY.items() if k not in ("JUDGE_BASE_URL", "JUDGE_API_KEY")},
    )  # fmt: skip
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: judge 'openai/gpt-4.1-mini' needs an API key: set OPENAI_API_KEY, or pass --judge-api-key "
        "(or a --judge-base-url of your own)"
    ]
    assert list(tmp_path.iterdir()) == []  # no inbox, no tiny model, no server folder

"""A throttled or failing judge: RULER waits before asking again, as long as the server asks.

A real loopback server answers the OpenAI chat route with scripted HTTP errors (429 with
Retry-After, 500, 400) before a valid judgement, and keeps when each request arrived, so the waits
are measured where they matter: between the requests the server saw.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import litellm
import pytest
from pydantic import PrivateAttr
from ruler_fixtures import judge_by_quality, make_group
from scripted_openai import LoopbackServer

from art_agents.llm import retry_after_s
from art_agents.ruler import Backoff, RulerError, ruler_score_group

Step = tuple[int, dict[str, str]] | str  # an HTTP error status and its headers, or an answer's content


class NotedBackoff(Backoff):
    """A backoff that notes each wait it hands out: the upper bound on a wait is asserted on these, since the gaps
    the server sees grow on a busy machine (their lower bound is asserted on the gaps)."""

    _waits: list[float] = PrivateAttr(default_factory=list)

    def wait_s(self, failures: int, retry_after_s: float | None = None) -> float:
        wait = super().wait_s(failures, retry_after_s)
        self._waits.append(wait)
        return wait

    @property
    def waits(self) -> list[float]:
        return self._waits


class FlakyJudge:
    """Answers each request with the next scripted step, then with a correct judgement."""

    def __init__(self, script: list[Step], *, repeat: bool = False) -> None:
        self.script = list(script)
        self.repeat = repeat  # keep answering the first step
        self.arrivals: list[float] = []
        self._server = LoopbackServer(self._handler())

    def params(self, **extra: Any) -> dict[str, Any]:
        return {
            "judge_model": "openai/judge",
            "api_base": f"{self._server.url}/v1",
            "api_key": "sk-test",
            "timeout": 60,  # loopback answers at once; a busy machine must not turn that into a timeout
            "cache_dir": None,
            **extra,
        }

    def gaps(self) -> list[float]:
        return [later - earlier for earlier, later in zip(self.arrivals, self.arrivals[1:], strict=False)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        judge = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                judge.arrivals.append(time.monotonic())
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                step = (judge.script[0] if judge.repeat else judge.script.pop(0)) if judge.script else None
                if isinstance(step, tuple):
                    status, headers = step
                    payload = {"error": {"message": f"scripted {status}", "type": "scripted", "code": status}}
                else:
                    status, headers = 200, {}
                    message = {"role": "assistant", "content": judge_by_quality(body) if step is None else step}
                    payload = {
                        "id": f"chatcmpl-{len(judge.arrivals)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body["model"],
                        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    }
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in {"content-type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def __enter__(self) -> FlakyJudge:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.close()


@pytest.fixture
def rate_limited() -> Iterator[FlakyJudge]:
    with FlakyJudge([(429, {"Retry-After": "1"})] * 2) as judge:
        yield judge


async def test_a_rate_limited_judge_is_asked_again_after_its_retry_after(
    rate_limited: FlakyJudge, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="art_agents.llm")
    backoff = NotedBackoff(initial_s=0.01)  # far below Retry-After: the server's wait must win
    scored = await ruler_score_group(make_group([0.2, 0.7]), backoff=backoff, **rate_limited.params())

    assert scored is not None and scored.rewards() == [0.2, 0.7]
    assert len(rate_limited.arrivals) == 3 and backoff.waits == [1.0, 1.0]
    assert all(gap >= 0.99 for gap in rate_limited.gaps()), rate_limited.gaps()
    ruler = scored.metadata["ruler"]
    assert [(c["attempt"], c["reached"]) for c in ruler["calls"]] == [(1, False), (2, False), (3, True)]
    assert all("RateLimitError" in c["problem"] for c in ruler["calls"][:2]) and ruler["calls"][2]["problem"] is None
    assert (ruler["prompt_tokens"], ruler["completion_tokens"]) == (10, 5)  # the paid call, counted once
    assert scored.trajectories[0].metrics["ruler_judge_calls"] == 3
    waits = [r.getMessage() for r in caplog.records if "asking again" in r.getMessage()]
    assert len(waits) == 2 and all("Retry-After: 1 s" in w and "RateLimitError" in w for w in waits)


async def test_a_failing_judge_without_retry_after_backs_off_exponentially() -> None:
    with FlakyJudge([(500, {})] * 2) as judge:
        backoff = NotedBackoff(initial_s=0.2, jitter=0)
        scored = await ruler_score_group(make_group([0.4, 0.1]), backoff=backoff, **judge.params())
    assert scored is not None and scored.rewards() == [0.4, 0.1]
    first, second = judge.gaps()
    assert backoff.waits == [0.2, 0.4] and first >= 0.19 and second >= 0.39, (first, second)
    assert ["InternalServerError" in (c["problem"] or "") for c in scored.metadata["ruler"]["calls"]] == [
        True,
        True,
        False,
    ]


async def test_a_rejected_request_is_not_asked_again() -> None:
    with FlakyJudge([(400, {})]) as judge, pytest.raises(RulerError, match="cannot be called"):
        await ruler_score_group(make_group([0.4, 0.1]), **judge.params())
    assert len(judge.arrivals) == 1


async def test_an_invalid_answer_is_asked_again_at_once() -> None:
    with FlakyJudge(['{"scores": [']) as judge:
        backoff = NotedBackoff(initial_s=30)
        scored = await ruler_score_group(make_group([0.4, 0.1]), backoff=backoff, **judge.params())
    assert scored is not None and scored.rewards() == [0.4, 0.1]
    assert len(judge.arrivals) == 2 and backoff.waits == []
    assert "not valid JSON" in scored.metadata["ruler"]["calls"][0]["problem"]


async def test_retry_after_is_capped_and_the_last_attempt_is_not_followed_by_a_wait() -> None:
    with FlakyJudge([(503, {"Retry-After": "30"})], repeat=True) as judge:
        backoff = NotedBackoff(max_s=0.2)
        with pytest.raises(RulerError, match="could not be reached in 2 attempts"):
            await ruler_score_group(make_group([0.4, 0.1]), max_attempts=2, backoff=backoff, **judge.params())
    assert len(judge.arrivals) == 2 and judge.gaps()[0] >= 0.19
    assert backoff.waits == [0.2]  # neither the 30 s asked for nor a wait after the last attempt


def _rate_limit(headers: dict[str, str]) -> litellm.RateLimitError:
    response = httpx.Response(429, headers=headers, request=httpx.Request("POST", "http://judge/v1/chat/completions"))
    return litellm.RateLimitError("slow down", llm_provider="openai", model="judge", response=response)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "2"}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # a date in the past: no wait
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "-3"}, None),
        ({}, None),
    ],
)
def test_retry_after_is_read_from_the_exception(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_s(_rate_limit(headers)) == expected


def test_retry_after_as_an_http_date() -> None:
    in_ten_seconds = format_datetime(datetime.now(UTC) + timedelta(seconds=10), usegmt=True)
    seconds = retry_after_s(_rate_limit({"Retry-After": in_ten_seconds}))
    assert seconds is not None and 8.0 <= seconds <= 10.0


def test_backoff_doubles_with_jitter_within_its_bounds() -> None:
    exact = Backoff(initial_s=1, max_s=5, jitter=0)
    assert [exact.wait_s(n) for n in (1, 2, 3, 4, 1000)] == [1, 2, 4, 5, 5]
    assert exact.wait_s(1, retry_after_s=3) == 3 and exact.wait_s(1, retry_after_s=60) == 5
    jittered = Backoff(initial_s=1, max_s=60, jitter=0.5)
    waits = [jittered.wait_s(3) for _ in range(200)]
    assert all(2.0 <= w <= 4.0 for w in waits) and len(set(waits)) > 1
    with pytest.raises(ValueError):
        Backoff(jitter=1.5)

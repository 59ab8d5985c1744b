"""Langfuse traces, as the official SDK exports them to a local stand-in for Langfuse's ingestion routes.

A LangGraph agent with a LangChain tool and an MCP tool runs on the real server (scripted engine),
RULER judges the group on a scripted judge, and `model.log` hands the group to the reporter: the
test then reads the OTLP spans and the scores that arrived and checks the trace structure.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph_agents import add, tool_call
from mcp_fixtures import kv_http  # noqa: F401 (a fixture)
from ruler_fixtures import answer, judge_params, shown
from scripted_openai import LoopbackServer, ScriptedOpenAI
from server_fixtures import hermes

from art_agents import Model, ModelConfig, RemoteBackend, TrainableModel, TrajectoryGroup
from art_agents.capture import record_completion, record_tool_call, rollout
from art_agents.integrations.langfuse_traces import LangfuseReporter, LangfuseWarning
from art_agents.integrations.langgraph import chat_model, wrap
from art_agents.integrations.mcp import MCPServer, MCPSession
from art_agents.report.reporters import StepRecord

ANSWER = "The answer is 5."
TRACES = "/api/public/otel/v1/traces"
SCORES = "/api/public/scores"


class LangfuseStandIn:
    """Langfuse's ingestion on loopback: OTLP/HTTP protobuf spans and the JSON scores route, kept as received."""

    def __init__(self, export_s: float = 0.0) -> None:
        self.export_s = export_s  # how long each span export takes, as for a Langfuse far away
        self.spans: list[dict[str, Any]] = []
        self.scores: list[dict[str, Any]] = []
        self.unexpected: list[str] = []
        self.auth: set[str] = set()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                stand_in.auth.add(self.headers.get("Authorization", ""))
                if self.path == TRACES:
                    time.sleep(stand_in.export_s)
                    stand_in.spans += spans_of(body)
                    self.reply(200, "application/x-protobuf", b"")
                elif self.path == SCORES:
                    stand_in.scores += json.loads(body)
                    self.reply(202, "application/json", b'{"message": "Accepted"}')
                else:
                    stand_in.unexpected.append(self.path)
                    self.reply(404, "application/json", b"{}")

            def reply(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = LoopbackServer(Handler)
        self.url = f"{self._server.url}"

    def __enter__(self) -> LangfuseStandIn:
        self._server.start(poll_interval=0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.close()


def spans_of(body: bytes) -> list[dict[str, Any]]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(body)
    return [
        {
            "name": span.name,
            "scope": scope_spans.scope.name,
            "trace_id": span.trace_id.hex(),
            "span_id": span.span_id.hex(),
            "parent_id": span.parent_span_id.hex() or None,
            "start": span.start_time_unix_nano / 1e9,
            "end": span.end_time_unix_nano / 1e9,
            "attributes": {a.key: decoded(a.value) for a in span.attributes},
        }
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


def decoded(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [decoded(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def attribute(span: dict[str, Any], key: str) -> Any:
    """A JSON attribute (input, output, usage, metadata values) decoded."""
    return json.loads(span["attributes"][key])


@pytest.fixture
def langfuse(monkeypatch: pytest.MonkeyPatch) -> Iterator[LangfuseStandIn]:
    """Langfuse's variables pointed at the stand-in; a fresh public key, since the SDK keeps one client per key."""
    with LangfuseStandIn() as stand_in:
        monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", f"pk-lf-{uuid.uuid4().hex}")
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-test")
        monkeypatch.setenv("LANGFUSE_BASE_URL", stand_in.url)
        monkeypatch.setenv("LANGFUSE_TIMEOUT", "300")  # close waits for every span and score, however busy the machine
        monkeypatch.delenv("ART_AGENTS_REPORT_TO", raising=False)
        yield stand_in


def mcp_put(session: MCPSession) -> Any:
    """The kv server's `put` as a LangChain tool, as a user wraps an MCP tool for a graph."""

    @tool
    async def put(key: str, value: str) -> str:
        """Store a value under a key."""
        return (await session.call_tool("put", {"key": key, "value": value})).content

    return put


async def test_a_judged_graph_rollout_is_one_trace_and_the_log_call_another(
    langfuse: LangfuseStandIn,
    server_url: str,
    tiny_model_path: Path,
    scripted: ScriptedOpenAI,
    kv_http: str,  # noqa: F811
) -> None:
    from langchain.agents import create_agent

    from art_agents.ruler import ruler_score_group

    backend = RemoteBackend(server_url)
    config = ModelConfig(
        engine="scripted",
        scripted_responses=[hermes("put", key="x", value="5"), hermes("add", a=2, b=3), ANSWER],
        default_max_tokens=64,
    )
    model = TrainableModel(name="traced", project="tests", base_model=str(tiny_model_path), config=config)
    await model.register(backend)  # the keys are set: Langfuse is on by itself
    assert [type(r).__name__ for r in model.reporters] == ["LangfuseReporter"]
    async with MCPServer(url=kv_http).session() as session:
        agent = wrap(create_agent(model.chat_model(), [add, mcp_put(session)], system_prompt="Calculate."), model=model)
        trajectories = [(await agent.ainvoke({"messages": [("user", "What is 2 + 3?")]})).trajectory for _ in range(2)]
    for trajectory, reward in zip(trajectories, (1.0, 0.5), strict=True):
        trajectory.reward = reward
    scripted.default = lambda body: answer([(i, 0.9 if i == "t0" else 0.2) for i, _ in shown(body)])
    group = await ruler_score_group(TrajectoryGroup(trajectories), **judge_params(scripted))
    assert group is not None
    first = group.trajectories[0]
    assert [c.span for c in first.tool_calls] == ["mcp:kv/put", "tools"]  # the MCP call is recorded once
    assert all(c.tool_call_id for c in first.tool_calls)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = await model.log([group], split="val")
        await backend.close()  # flushes the reporter
    assert not [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]  # LangfuseWarning is one

    assert not langfuse.unexpected and len(langfuse.auth) == 1 and langfuse.auth.pop().startswith("Basic ")
    traces: dict[str, list[dict[str, Any]]] = {}
    for span in langfuse.spans:
        assert span["scope"] == "art_agents"
        traces.setdefault(span["trace_id"], []).append(span)
    assert len(traces) == 3  # two rollouts and the log call
    session_ids = {s["attributes"]["session.id"] for s in langfuse.spans}
    assert len(session_ids) == 1 and session_ids.pop().startswith("tests/traced/")

    from langfuse import Langfuse

    spans = traces[Langfuse.create_trace_id(seed=first.id)]
    by_id = {s["span_id"]: s for s in spans}
    [root] = [s for s in spans if s["parent_id"] is None]
    assert root["name"] == root["attributes"]["langfuse.trace.name"] == "tests/traced rollout"
    assert root["attributes"]["langfuse.observation.type"] == "agent"
    assert attribute(root, "langfuse.observation.input") == [{"role": "user", "content": "What is 2 + 3?"}]
    assert attribute(root, "langfuse.observation.output")["content"] == ANSWER
    assert attribute(root, "langfuse.trace.metadata.trajectory_id") == first.id
    assert attribute(root, "langfuse.trace.metadata.split") == "val"
    assert attribute(root, "langfuse.trace.metadata.step") == result.step == 0
    assert root["start"] == pytest.approx(first.started_at, abs=1e-6)
    assert root["end"] == pytest.approx(first.finished_at, abs=1e-6)

    def path(span: dict[str, Any]) -> str:
        parent = by_id.get(span["parent_id"])
        kind = span["attributes"]["langfuse.observation.type"]
        return (path(parent) + " > " if parent is not None and parent is not root else "") + f"{kind}:{span['name']}"

    ordered = sorted((s for s in spans if s is not root), key=lambda s: (s["start"], s["parent_id"] != root["span_id"]))
    model_name = f"chat {model.name}@0"
    assert [path(s) for s in ordered] == [
        "span:model",
        f"span:model > generation:{model_name}",
        "tool:mcp:kv/put",
        "span:model",
        f"span:model > generation:{model_name}",
        "span:tools",
        "span:tools > tool:add",
        "span:model",
        f"span:model > generation:{model_name}",
    ]
    for span in ordered:  # every child lies within its parent
        parent = by_id.get(span["parent_id"], root)
        assert parent["start"] <= span["start"] <= span["end"] <= parent["end"] + 1e-6

    generations = [s for s in ordered if s["attributes"]["langfuse.observation.type"] == "generation"]
    for span, turn in zip(generations, first.turns, strict=True):
        request = [m.wire() for m in first.history_messages(turn.history)[: turn.index]]
        assert attribute(span, "langfuse.observation.input") == request
        assert attribute(span, "langfuse.observation.output") == first.messages[turn.index].wire()
        assert span["attributes"]["langfuse.observation.model.name"] == f"{model.name}@0"
        assert attribute(span, "langfuse.observation.metadata.policy_step") == 0
        assert attribute(span, "langfuse.observation.metadata.completion_id") == turn.completion_id
        usage = attribute(span, "langfuse.observation.usage_details")
        assert usage["input"] == turn.usage["prompt_tokens"] > 0 and usage["output"] == turn.usage["completion_tokens"]
        assert span["start"] == pytest.approx(turn.started_at, abs=1e-6)
        assert span["end"] - span["start"] == pytest.approx(turn.latency_s, abs=1e-6)
    mcp, langchain_tool = (s for s in ordered if s["attributes"]["langfuse.observation.type"] == "tool")
    assert attribute(mcp, "langfuse.observation.input") == {"key": "x", "value": "5"}
    assert mcp["attributes"]["langfuse.observation.output"] == "stored x"
    assert attribute(langchain_tool, "langfuse.observation.input") == {"a": 2, "b": 3}
    assert langchain_tool["attributes"]["langfuse.observation.output"] == "5"

    scores = {(s["traceId"], s["name"]): s for s in langfuse.scores}
    assert len(scores) == len(langfuse.scores) == 6  # reward, ruler_score, independent_reward for each rollout
    trace_id = Langfuse.create_trace_id(seed=first.id)
    assert scores[trace_id, "reward"]["value"] == scores[trace_id, "ruler_score"]["value"] == first.reward
    assert "judged t" in scores[trace_id, "ruler_score"]["comment"]
    assert scores[trace_id, "independent_reward"]["value"] == 1.0

    [step] = [s for spans in traces.values() for s in spans if s["name"].endswith("step 0")]
    assert step["name"] == "tests/traced val step 0" and step["parent_id"] is None
    assert attribute(step, "langfuse.observation.output") == result.metrics
    assert attribute(step, "langfuse.trace.metadata.val/reward") == result.metrics["val/reward"]
    assert attribute(step, "langfuse.observation.input") == {"groups": 1, "trajectories": 2}


async def test_a_tool_that_raises_is_recorded_and_exported_as_an_error(
    langfuse: LangfuseStandIn, scripted: ScriptedOpenAI
) -> None:
    from langgraph.prebuilt import ToolNode, create_react_agent

    @tool
    def divide(a: int, b: int) -> float:
        """Divide a by b."""
        return a / b

    scripted.replies = [{"content": None, "tool_calls": [tool_call("c1", "divide", a=1, b=0)]}, "It cannot be done."]
    model = Model(name="agent", inference_base_url=scripted.base_url)
    graph = create_react_agent(chat_model(model), ToolNode([divide], handle_tool_errors=True))
    trajectory, _ = await wrap(graph, model=model).ainvoke({"messages": [("user", "What is 1 / 0?")]})
    [call] = trajectory.tool_calls
    assert (call.name, call.arguments, call.span, call.tool_call_id) == ("divide", {"a": 1, "b": 0}, "tools", "c1")
    assert (call.result, call.error) == (None, "ZeroDivisionError: division by zero")

    reporter = LangfuseReporter(TrainableModel(name="tools", project="tests", base_model="unused"))
    now = time.time()
    reporter.record(StepRecord("val", 0, [TrajectoryGroup([trajectory])], {}, now - 1, now))
    reporter.close()
    [span] = [s for s in langfuse.spans if s["attributes"]["langfuse.observation.type"] == "tool"]
    assert span["name"] == "divide" and span["attributes"]["langfuse.observation.level"] == "ERROR"
    assert span["attributes"]["langfuse.observation.status_message"] == call.error


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def small_record(count: int, tool_calls: int = 1) -> StepRecord:
    """A train step of `count` rollouts, each a model call and `tool_calls` tool calls."""
    trajectories = []
    for n in range(count):
        with rollout() as trajectory:
            request = [{"role": "user", "content": f"question {n}"}]
            record_completion(request, {"role": "assistant", "content": "answer"}, model="m@3", latency_s=0.01)
            for k in range(tool_calls):
                record_tool_call("lookup", {"q": k}, result="found", duration_s=0.001)
        trajectories.append(trajectory)
    now = time.time()
    return StepRecord("train", 4, [TrajectoryGroup(trajectories)], {"loss": 0.5}, now - 1, now)


def test_a_dead_host_costs_warnings_at_most_and_close_returns_in_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", f"pk-lf-{uuid.uuid4().hex}")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-test")
    monkeypatch.setenv("LANGFUSE_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("LANGFUSE_TIMEOUT", "1")
    reporter = LangfuseReporter(TrainableModel(name="down", project="tests", base_model="unused"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.monotonic()
        reporter.record(small_record(20))
        reporter.close()
        took = time.monotonic() - started
    assert took < 30, took  # bounded by LANGFUSE_TIMEOUT (1 s), not the SDK's retries of every batch (minutes)
    caught = [w for w in caught if not issubclass(w.category, ResourceWarning)]  # other tests' garbage, collected now
    assert all(issubclass(w.category, LangfuseWarning) for w in caught), [str(w.message) for w in caught]
    assert len(caught) <= 1 and all("did not take the traces" in str(w.message) for w in caught)


def test_a_failure_inside_the_reporter_is_one_warning_per_kind(
    langfuse: LangfuseStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    reporter = LangfuseReporter(TrainableModel(name="broken", project="tests", base_model="unused"))
    record = small_record(3)
    record.groups[0].trajectories[1].turns[0].index = 7  # points past its history
    with pytest.warns(LangfuseWarning) as caught:
        reporter.record(record)
        reporter.record(record)
        reporter.close()  # the records are exported by the reporter's thread: wait for it
    # pytest.warns records every warning in the process meanwhile (another thread's DeprecationWarning, say)
    ours = [w for w in caught if issubclass(w.category, LangfuseWarning)]
    assert len(ours) == 1 and "could not export trajectory" in str(ours[0].message), [str(w.message) for w in caught]
    assert len({s["trace_id"] for s in langfuse.spans}) == 2 + 2  # the two good rollouts (logged twice), two steps


def test_a_step_larger_than_the_span_queue_arrives_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTel drops spans past its queue; the reporter sends each batch of 512 before building more."""
    with LangfuseStandIn(export_s=0.1) as langfuse:
        monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", f"pk-lf-{uuid.uuid4().hex}")
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-test")
        monkeypatch.setenv("LANGFUSE_BASE_URL", langfuse.url)
        monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "600")  # read by the SDK's span processor for this new key
        monkeypatch.setenv("LANGFUSE_TIMEOUT", "300")  # close waits for all of it, however busy the machine
        reporter = LangfuseReporter(TrainableModel(name="big", project="tests", base_model="unused"))
        reporter.record(small_record(150, tool_calls=9))  # 11 spans each (rollout, generation, tools), and the step
        reporter.close()
    assert len(langfuse.spans) == 150 * 11 + 1 and len(langfuse.scores) == 150


def test_without_keys_an_explicit_report_to_says_which_variables_are_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from art_agents.errors import ArtError

    for key in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ArtError, match="needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY"):
        LangfuseReporter(TrainableModel(name="nokeys", project="tests", base_model="unused"))


@pytest.mark.slow
def test_the_overhead_benchmark_runs_and_cleans_up(tmp_path: Path) -> None:
    script = Path(__file__).parent.parent / "benchmarks" / "langfuse_overhead.py"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("LANGFUSE_")}
    result = subprocess.run(
        [sys.executable, str(script), "--rounds", "2", "--groups", "2", "--group-size", "2"],
        capture_output=True, text=True, timeout=600, env={**env, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ratio of medians" in result.stdout
    assert not list(scratch.glob("art-*"))

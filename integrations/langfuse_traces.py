"""Langfuse traces of rollouts and training steps, exported after the fact with the recorded times.

Every trajectory of a train or log call becomes one trace: a root observation for the rollout, a
span per LangGraph node, a generation per model call (request, response, token usage, `name@step`,
policy step), a tool observation per executed tool (MCP calls under the root by their `mcp:` name),
and the reward, RULER's score (its explanation as the comment) and the independent reward as scores
on the trace. Each step is a trace of its own with its metrics. It is on with `report_to=["langfuse"]`
or Langfuse's own key variables (see `art_agents.report.reporters`); the rest is the SDK's standard
configuration (`LANGFUSE_BASE_URL`, `LANGFUSE_TIMEOUT`, `LANGFUSE_SAMPLE_RATE`, ...).

Why spans of our own: a trajectory is complete (rewarded, judged) only after it ran, and the SDK's
`start_observation` stamps the current time. So the reporter owns an OpenTelemetry provider whose
spans carry the trajectory's own times and hands it to `Langfuse(tracer_provider=...)`: the SDK adds
its batching span processor and OTLP exporter (auth, retries, compression) to it. Trace ids derive
from trajectory ids (`Langfuse.create_trace_id(seed=trajectory.id)`), span ids from their place in
the trajectory and score ids from their name, so a trajectory logged twice updates one trace.

Langfuse being down never slows or breaks training: `record` only puts the record in a short queue
(a step's traces are dropped with a warning when it is full) and returns; a thread of the reporter
builds the spans (`langfuse_spans`) and waits for each batch to be sent before building more, so OTel's span queue
never overflows and a dead host costs little more than that thread's waiting. Failures become one
warning per kind, and `close()` and interpreter exit wait at most `LANGFUSE_TIMEOUT` seconds (5 by
default) for what is still unsent.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from langfuse import Langfuse

from art_agents.errors import ArtError
from art_agents.integrations.langfuse_spans import LangfuseWarning, Sink, TraceSpans, ns, shared_sink
from art_agents.integrations.queued_reporter import QueuedReporter
from art_agents.report.reporters import LANGFUSE_KEYS, StepRecord
from art_agents.trajectory import ToolCallRecord, Trajectory, TrajectoryGroup, Turn

if TYPE_CHECKING:
    from art_agents.model import TrainableModel

# Langfuse's OpenTelemetry attributes (the SDK's langfuse/_client/attributes.py; "property mapping" in its docs)
TRACE_NAME = "langfuse.trace.name"
TRACE_TAGS = "langfuse.trace.tags"
TRACE_METADATA = "langfuse.trace.metadata"
SESSION_ID = "session.id"
OBSERVATION_TYPE = "langfuse.observation.type"
INPUT = "langfuse.observation.input"
OUTPUT = "langfuse.observation.output"
METADATA = "langfuse.observation.metadata"
LEVEL = "langfuse.observation.level"
STATUS_MESSAGE = "langfuse.observation.status_message"
MODEL = "langfuse.observation.model.name"
USAGE = "langfuse.observation.usage_details"

SPANS_PER_FLUSH = 512  # the SDK's export batch: sent before more are built, so OTel's queue (2048) never overflows
USAGE_NAMES = {"prompt_tokens": "input", "completion_tokens": "output", "total_tokens": "total"}
RULER_LOG_PREFIX = "RULER ("


class _Event(NamedTuple):
    """A model turn or tool call with its place in the rollout's timeline and its times (seconds)."""

    number: int
    item: Turn | ToolCallRecord
    start: float
    end: float


class LangfuseReporter(QueuedReporter):
    """Sends every train and log call of one model to Langfuse: a trace per trajectory, one per step."""

    service, warning, items = "Langfuse", LangfuseWarning, "traces"

    def __init__(self, model: TrainableModel) -> None:
        missing = [key for key in LANGFUSE_KEYS if not os.environ.get(key)]
        if missing:
            raise ArtError(
                f"report_to='langfuse' needs {' and '.join(missing)} (and LANGFUSE_BASE_URL for a self-hosted "
                "Langfuse) in the environment; set them, or drop 'langfuse' from report_to"
            )
        self.project = model.project
        # groups this run's traces in Langfuse's sessions view
        self.session_id = f"{model.project}/{model.name}/{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self._sink: Sink | None = None
        super().__init__(model.name, "Langfuse")
        self._unsent = 0  # spans built since the export thread last waited for a batch to go
        if os.environ.get("LANGFUSE_TRACING_ENABLED", "true").lower() == "false":
            return
        sink = shared_sink()
        if sink.exporting:
            self._sink = sink
            self._target = f"Langfuse at {sink.base_url}"
        else:
            self._warn(
                "client",
                f"Langfuse was already set up in this process for public key {os.environ['LANGFUSE_PUBLIC_KEY']} "
                f"before model {model.name!r} registered, so its traces cannot be exported; register the model "
                "before creating Langfuse clients (or its LangChain CallbackHandler)",
            )

    def record(self, record: StepRecord) -> None:
        """Hand the record to the export thread and return at once; never raises."""
        if self._sink is not None:
            super().record(record)

    def close(self) -> None:
        """Send what is waiting, for at most LANGFUSE_TIMEOUT seconds in all; never raises."""
        if self._sink is None:
            return
        try:
            deadline = time.monotonic() + self._sink.timeout_s
            if not self._drained(self._sink.timeout_s) or not self._sink.flush(deadline - time.monotonic()):
                self._warn(
                    "flush",
                    f"Langfuse at {self._sink.base_url} did not take the traces within {self._sink.timeout_s:g}s "
                    "(LANGFUSE_TIMEOUT); is it up? They are retried in the background until the process exits",
                )
        except Exception as exc:
            self._warn(f"close:{type(exc).__name__}", "could not flush", exc)

    def _send(self, record: StepRecord) -> None:
        """Traces of the record, waiting for each batch of spans to be sent before building the next.

        The wait is the backpressure: OTel's queue never overflows with a large step, and while
        Langfuse is down this thread sits in the exporter's retries instead of building spans.
        """
        assert self._sink is not None
        for index, group in enumerate(record.groups):
            for trajectory in _trajectories(group):
                try:
                    self._unsent += self._export_trajectory(self._sink, trajectory, record, index)
                except Exception as exc:
                    self._warn(f"trajectory:{type(exc).__name__}", f"could not export trajectory {trajectory.id}", exc)
                if self._unsent >= SPANS_PER_FLUSH:
                    self._sink.provider.force_flush()
                    self._unsent = 0
        try:
            self._export_step(self._sink, record)
        except Exception as exc:
            self._warn(f"step:{type(exc).__name__}", f"could not export {record.split} step {record.step}", exc)

    def _trace_attributes(self, name: str, tags: list[str]) -> dict[str, Any]:
        """Trace-level attributes, which Langfuse reads from every observation of the trace."""
        return {TRACE_NAME: f"{self.project}/{self.model_name} {name}", SESSION_ID: self.session_id, TRACE_TAGS: tags}

    def _export_trajectory(self, sink: Sink, trajectory: Trajectory, record: StepRecord, group: int) -> int:
        """Queue the trajectory's spans and scores; returns how many spans."""
        trace_id = Langfuse.create_trace_id(seed=trajectory.id)
        trace_attributes = self._trace_attributes("rollout", ["rollout", record.split])
        spans = TraceSpans(sink, trace_attributes, seed=trajectory.id, trace_id=int(trace_id, 16))
        events = [_Event(n, item, *_times(item, trajectory)) for n, item in enumerate(trajectory.timeline())]
        start = min([trajectory.started_at, *(e.start for e in events)])
        end = max([trajectory.finished_at or start, *(e.end for e in events)])
        about = {
            **trajectory.metadata,
            "trajectory_id": trajectory.id,
            "split": record.split,
            "step": record.step,
            "group": group,
            "failed": trajectory.failed,
            "reward": trajectory.reward,
            "metrics": trajectory.metrics,
        }
        root_attributes = {
            OBSERVATION_TYPE: "agent",
            INPUT: _opening(trajectory),
            OUTPUT: _final_answer(trajectory),
            **_metadata(TRACE_METADATA, about),
        }
        if trajectory.failed:
            root_attributes |= {LEVEL: "ERROR", STATUS_MESSAGE: trajectory.logs[-1] if trajectory.logs else "failed"}
        root = spans.start("root", f"{self.project}/{self.model_name} rollout", start, None, root_attributes)
        wires: dict[int, list[dict[str, Any]]] = {}  # each history's messages dumped once, not once per turn
        for number, (label, members) in enumerate(_by_node(events)):
            parent = root
            if label is not None:
                parent = spans.start(f"node/{number}", label, members[0].start, root, {OBSERVATION_TYPE: "span"})
            for event in members:
                name, attributes = (
                    _generation(trajectory, event.item, wires) if isinstance(event.item, Turn) else _tool(event.item)
                )
                spans.start(f"event/{event.number}", name, event.start, parent, attributes).end(end_time=ns(event.end))
            if parent is not root:
                parent.end(end_time=ns(max(e.end for e in members)))
        root.end(end_time=ns(end))
        self._scores(sink, trajectory, trace_id, record)
        return spans.started

    def _scores(self, sink: Sink, trajectory: Trajectory, trace_id: str, record: StepRecord) -> None:
        explanation = "\n".join(line for line in trajectory.logs if line.startswith(RULER_LOG_PREFIX)) or None
        scores: list[tuple[str, Any, str | None]] = [("reward", trajectory.reward, None)]
        if "ruler_score" in trajectory.metrics:
            scores.append(("ruler_score", trajectory.metrics["ruler_score"], explanation))
        if "independent_reward" in trajectory.metrics:
            scores.append(("independent_reward", trajectory.metrics["independent_reward"], None))
        for name, value, comment in scores:
            sink.client.create_score(
                trace_id=trace_id,
                score_id=Langfuse.create_trace_id(seed=f"{trajectory.id}/{name}"),  # logged again: the same score
                name=name,
                value=float(value),
                data_type="NUMERIC",
                comment=comment,
                metadata={"split": record.split, "step": record.step},
            )

    def _export_step(self, sink: Sink, record: StepRecord) -> None:
        title = f"{record.split} step {record.step}"
        spans = TraceSpans(sink, self._trace_attributes(title, ["step", record.split]))
        count = sum(len(_trajectories(group)) for group in record.groups)
        about = {"split": record.split, "step": record.step, **record.metrics}
        attributes = {
            OBSERVATION_TYPE: "span",
            INPUT: _serialized({"groups": len(record.groups), "trajectories": count}),
            OUTPUT: _serialized(record.metrics),
            **_metadata(TRACE_METADATA, about),
        }
        span = spans.start("step", f"{self.project}/{self.model_name} {title}", record.started_at, None, attributes)
        span.end(end_time=ns(record.finished_at))


def _trajectories(group: TrajectoryGroup) -> list[Trajectory]:
    """The group's trajectories, and the partial ones of rollouts that raised."""
    return [*group.trajectories, *(e.trajectory for e in group.exceptions if e.trajectory is not None)]


def _times(event: Turn | ToolCallRecord, trajectory: Trajectory) -> tuple[float, float]:
    """(start, end) in seconds; a turn built from a `Choice` has no start time: the rollout's."""
    if isinstance(event, Turn):
        start = event.started_at if event.started_at is not None else trajectory.started_at
        return start, start + event.latency_s
    return event.started_at, event.started_at + event.duration_s


def _by_node(events: list[_Event]) -> list[tuple[str | None, list[_Event]]]:
    """Runs of consecutive events in the same graph node; events outside a node (MCP calls too) stand alone."""
    runs: list[tuple[str | None, list[_Event]]] = []
    for event in events:
        label = event.item.span
        if label is not None and label.startswith("mcp:"):
            label = None
        if label is not None and runs and runs[-1][0] == label:
            runs[-1][1].append(event)
        else:
            runs.append((label, [event]))
    return runs


def _generation(
    trajectory: Trajectory, turn: Turn, wires: dict[int, list[dict[str, Any]]]
) -> tuple[str, dict[str, Any]]:
    if turn.history not in wires:
        wires[turn.history] = [m.wire() for m in trajectory.history_messages(turn.history)]
    messages = wires[turn.history]
    about = {
        "policy_step": turn.policy_step,
        "completion_id": turn.completion_id,
        "finish_reason": turn.finish_reason,
        "node": turn.span,
        "history": turn.history or None,
    }
    usage = {USAGE_NAMES.get(k, k): v for k, v in (turn.usage or {}).items() if type(v) is int}
    return f"chat {turn.model}" if turn.model else "chat", {
        OBSERVATION_TYPE: "generation",
        INPUT: _serialized(messages[: turn.index]),
        OUTPUT: _serialized(messages[turn.index]),
        MODEL: turn.model,
        USAGE: _serialized(usage) if usage else None,
        **_metadata(METADATA, about),
    }


def _tool(call: ToolCallRecord) -> tuple[str, dict[str, Any]]:
    name = call.span if call.span and call.span.startswith("mcp:") else call.name
    attributes = {
        OBSERVATION_TYPE: "tool",
        INPUT: _serialized(call.arguments),
        OUTPUT: call.result,
        **_metadata(METADATA, {"tool_call_id": call.tool_call_id, "node": call.span}),
    }
    if call.error is not None:
        attributes |= {LEVEL: "ERROR", STATUS_MESSAGE: call.error}
    return name, attributes


def _opening(trajectory: Trajectory) -> str | None:
    """The user messages before the first answer: what the rollout was asked."""
    opening = []
    for message in trajectory.messages:
        if message.role == "assistant":
            break
        if message.role == "user":
            opening.append(message.wire())
    return _serialized(opening) if opening else None


def _final_answer(trajectory: Trajectory) -> str | None:
    last = next((m for m in reversed(trajectory.messages) if m.role == "assistant"), None)
    return _serialized(last.wire()) if last is not None else None


def _serialized(value: Any) -> str:
    """Input, output and usage as Langfuse reads them: JSON, or a string as it is."""
    return value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)


def _metadata(prefix: str, values: Mapping[str, Any]) -> dict[str, str]:
    """One attribute per key, every value JSON-encoded (strings too), as the SDK writes them."""
    return {
        f"{prefix}.{key}": json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))
        for key, value in values.items()
        if value is not None
    }

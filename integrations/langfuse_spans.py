"""Our OpenTelemetry provider for Langfuse: spans that carry a trajectory's recorded times and chosen ids.

One `Sink` (the Langfuse client and the provider handed to it) serves every reporter of a public key,
since the SDK keeps one client per key in a process. `TraceSpans` starts the spans of one trace with
explicit start times and, given a seed, ids derived from it, so a trajectory logged twice updates one
trace. Exit waits at most `LANGFUSE_TIMEOUT` seconds (5 by default) for what is still unsent.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any

from langfuse import Langfuse
from langfuse.span_filter import is_default_export_span
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

SCOPE = "art_agents"  # instrumentation scope of our spans; the Langfuse processor is told to export it
# resource attributes of Langfuse's (the SDK's langfuse/_client/attributes.py)
ENVIRONMENT = "langfuse.environment"
RELEASE = "langfuse.release"
_NO_PARENT = Context()  # an empty context: a root span even inside the caller's own OTel span


class LangfuseWarning(RuntimeWarning):
    """Langfuse could not take some traces; training is unaffected."""


class _ChosenIds(RandomIdGenerator):
    """Random ids, except for the span the reporter starts next, whose ids it picked (per thread)."""

    def __init__(self) -> None:
        self._next = threading.local()

    def pick(self, trace_id: int | None, span_id: int | None) -> None:
        self._next.trace_id, self._next.span_id = trace_id, span_id

    def generate_trace_id(self) -> int:
        return getattr(self._next, "trace_id", None) or super().generate_trace_id()

    def generate_span_id(self) -> int:
        return getattr(self._next, "span_id", None) or super().generate_span_id()


class Sink:
    """The Langfuse client and our provider for one public key.

    The SDK keeps one client per public key in a process and ignores the `tracer_provider` of any
    later one, so every reporter for a key shares this.
    """

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.timeout_s = float(os.environ.get("LANGFUSE_TIMEOUT") or 5)
        self.ids = _ChosenIds()
        self.provider = TracerProvider(
            resource=Resource.create(
                _from_environment({ENVIRONMENT: "LANGFUSE_TRACING_ENVIRONMENT", RELEASE: "LANGFUSE_RELEASE"})
            ),
            sampler=_sampler(),
            id_generator=self.ids,
            shutdown_on_exit=False,  # _exit does it, with a bounded wait
        )
        self.client = Langfuse(tracer_provider=self.provider, should_export_span=_exported)
        self.tracer = self.provider.get_tracer(SCOPE)
        self._flushing: threading.Thread | None = None
        self._lock = threading.Lock()
        if self.exporting:
            atexit.register(self._exit)  # registered after the SDK's own exit handler, so it runs first

    @property
    def exporting(self) -> bool:
        """Whether the SDK took our provider (not when tracing is off or a client for this key existed)."""
        resources = getattr(self.client, "_resources", None)
        return getattr(resources, "tracer_provider", None) is self.provider

    def flush(self, wait_s: float) -> bool:
        """Send what is queued (spans and scores), waiting at most `wait_s`; False when some is still unsent."""
        with self._lock:
            if self._flushing is None or not self._flushing.is_alive():
                self._flushing = threading.Thread(target=self.client.flush, name="langfuse-flush", daemon=True)
                self._flushing.start()
            flushing = self._flushing
        flushing.join(max(0.0, wait_s))
        return not flushing.is_alive()

    def _exit(self) -> None:
        """Stop within `timeout_s`: the SDK's own exit flush tries every queued batch in turn (minutes when down).

        The batch processor is shut first: its worker makes one last export, and the flush inside the
        SDK's shutdown (which also unregisters the SDK's exit handler) returns at once.
        """
        deadline = time.monotonic() + self.timeout_s
        stopping = [
            threading.Thread(target=stop, daemon=True) for stop in (self.provider.shutdown, self.client.shutdown)
        ]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join(max(0.0, deadline - time.monotonic()))


_sinks: dict[str, Sink] = {}
_sinks_lock = threading.Lock()


def shared_sink() -> Sink:
    """The sink for the configured public key, created on first use."""
    public_key = os.environ["LANGFUSE_PUBLIC_KEY"]
    base_url = os.environ.get("LANGFUSE_BASE_URL") or os.environ.get("LANGFUSE_HOST") or "https://cloud.langfuse.com"
    with _sinks_lock:
        sink = _sinks.get(public_key)
        if sink is None:
            sink = _sinks[public_key] = Sink(base_url)
        elif sink.base_url != base_url:
            warnings.warn(
                f"Langfuse keeps one client per public key in a process: traces keep going to {sink.base_url}, "
                f"not to {base_url}",
                LangfuseWarning,
                stacklevel=3,
            )
    return sink


class TraceSpans:
    """Starts the spans of one trace with explicit times; with a seed, their ids derive from it."""

    def __init__(
        self, sink: Sink, trace_attributes: dict[str, Any], *, seed: str | None = None, trace_id: int | None = None
    ) -> None:
        self.sink, self.trace_attributes, self.seed, self.trace_id = sink, trace_attributes, seed, trace_id
        self.started = 0

    def start(
        self, path: str, name: str, start_s: float, parent: trace.Span | None, attributes: Mapping[str, Any]
    ) -> trace.Span:
        context = _NO_PARENT if parent is None else trace.set_span_in_context(parent)
        self.started += 1
        if self.seed is not None:
            self.sink.ids.pick(self.trace_id if parent is None else None, _span_id(f"{self.seed}/{path}"))
        try:
            return self.sink.tracer.start_span(
                name,
                context=context,
                start_time=ns(start_s),
                attributes={**self.trace_attributes, **{k: v for k, v in attributes.items() if v is not None}},
            )
        finally:
            self.sink.ids.pick(None, None)


def _span_id(seed: str) -> int:
    return int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big") or 1


def ns(seconds: float) -> int:
    """OpenTelemetry's time: integer nanoseconds."""
    return int(seconds * 1e9)


def _exported(span: ReadableSpan) -> bool:
    """Our spans, and whatever the SDK exports by default (a user's own Langfuse client shares the provider)."""
    scope = span.instrumentation_scope
    return (scope is not None and scope.name == SCOPE) or is_default_export_span(span)


def _from_environment(names: Mapping[str, str]) -> dict[str, str]:
    """Resource attributes from the environment variables that are set."""
    return {attribute: os.environ[variable] for attribute, variable in names.items() if os.environ.get(variable)}


def _sampler() -> TraceIdRatioBased | None:
    """LANGFUSE_SAMPLE_RATE, decided by trace id as the SDK does (so a trace's scores follow it)."""
    rate = float(os.environ.get("LANGFUSE_SAMPLE_RATE") or 1.0)
    return TraceIdRatioBased(rate) if rate < 1.0 else None

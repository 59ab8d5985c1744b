"""httpx transports that record chat completions into the current rollout.

Only clients the toolkit builds carry these transports, so an unrelated httpx or OpenAI client is
never touched. Streaming responses are passed through chunk by chunk and assembled on the side.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from art_agents.capture import current_trajectory, record_completion, request_overrides
from art_agents.trajectory import Trajectory
from art_agents.wire import ROLLOUT_HEADER

MODEL_ROUTES = ("/chat/completions", "/responses", "/messages", "/completions")  # every protocol's model call


def is_chat_completion(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.endswith("/chat/completions")


def with_overrides(body: bytes | str | None) -> bytes | None:
    """A JSON request body with `request_overrides()` set in it, or None when there are none or it is not JSON."""
    fields = request_overrides()
    if not fields:
        return None
    try:
        data = json.loads(body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return json.dumps({**data, **fields}).encode() if isinstance(data, dict) else None


class _Call:
    """A chat completion request made inside a rollout, bound to that rollout's trajectory."""

    def __init__(self, trajectory: Trajectory, body: dict[str, Any]) -> None:
        self.trajectory, self.body = trajectory, body
        self.started = time.perf_counter()
        self.recorded = False

    def record(self, message: dict[str, Any], response: dict[str, Any]) -> None:
        record_completion(
            self.body["messages"],
            message,
            tools=self.body.get("tools"),
            completion_id=response.get("id"),
            model=response.get("model"),
            latency_s=time.perf_counter() - self.started,
            finish_reason=response.get("finish_reason"),
            usage=response.get("usage"),
            trajectory=self.trajectory,
        )

    def record_body(self, content: bytes) -> None:
        try:
            response = json.loads(content)
            choice = response["choices"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            return  # an error body: nothing was sampled, nothing to record
        self.record(choice["message"], {**response, "finish_reason": choice.get("finish_reason")})

    def record_stream(self, stream: StreamAssembler) -> None:
        """Record once, when the stream ends; clients may stop reading at `[DONE]` or close early."""
        if stream.id is not None and not self.recorded:
            self.recorded = True
            summary = {
                "id": stream.id,
                "model": stream.model,
                "finish_reason": stream.finish_reason,
                "usage": stream.usage,
            }
            self.record(stream.message(), summary)


def overridden(request: httpx.Request) -> httpx.Request:
    """A model call (any protocol) with `request_overrides()` set in its JSON body; any other request as it is.

    The request keeps its class: httpx's, or httpx2's for the clients of the SDKs built on that fork."""
    if request.method != "POST" or not request.url.path.endswith(MODEL_ROUTES):
        return request
    content = with_overrides(request.content)
    if content is None:
        return request
    headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
    return type(request)(request.method, request.url, headers=headers, content=content, extensions=request.extensions)


def _prepare(request: httpx.Request) -> _Call | None:
    """The call to record, or None when this request is not ours to record."""
    trajectory = current_trajectory()
    if trajectory is None or not is_chat_completion(request):
        return None
    request.headers[ROLLOUT_HEADER] = trajectory.id
    try:
        body = json.loads(request.content or b"{}")
    except json.JSONDecodeError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return None
    return _Call(trajectory, body)


def _handed_on(response: httpx.Response, **body: Any) -> httpx.Response:
    """The response passed to the client with its body (`content` or `stream`) already decoded."""
    headers = [(k, v) for k, v in response.headers.raw if k.lower() not in (b"content-encoding", b"content-length")]
    return httpx.Response(response.status_code, headers=headers, extensions=response.extensions, **body)


class StreamAssembler:
    """Rebuilds the final chat completion from server-sent event chunks."""

    def __init__(self) -> None:
        self._buffer = b""
        self.done = False
        self.id: str | None = None
        self.model: str | None = None
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            line = line.strip()
            if line.startswith(b"data:") and line[5:].strip() == b"[DONE]":
                self.done = True
            elif line.startswith(b"data:"):
                try:
                    self._chunk(json.loads(line[5:]))
                except json.JSONDecodeError:
                    continue

    def _chunk(self, chunk: dict[str, Any]) -> None:
        self.id = chunk.get("id") or self.id
        self.model = chunk.get("model") or self.model
        self.usage = chunk.get("usage") or self.usage
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # n > 1 streams are recorded from choice 0 only, as the SDK's helpers do
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(call.get("index", 0), {"id": "", "name": "", "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(self.tool_calls.items())
            ]
        return message


class _RecordingAsyncStream(httpx.AsyncByteStream):
    def __init__(self, response: httpx.Response, call: _Call) -> None:
        self._response, self._call = response, call
        self._assembler = StreamAssembler()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.aiter_bytes():
            self._assembler.feed(chunk)
            if self._assembler.done:
                self._call.record_stream(self._assembler)
            yield chunk
        self._call.record_stream(self._assembler)

    async def aclose(self) -> None:
        self._call.record_stream(self._assembler)
        await self._response.aclose()


class _RecordingSyncStream(httpx.SyncByteStream):
    def __init__(self, response: httpx.Response, call: _Call) -> None:
        self._response, self._call = response, call
        self._assembler = StreamAssembler()

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._response.iter_bytes():
            self._assembler.feed(chunk)
            if self._assembler.done:
                self._call.record_stream(self._assembler)
            yield chunk
        self._call.record_stream(self._assembler)

    def close(self) -> None:
        self._call.record_stream(self._assembler)
        self._response.close()


class CaptureAsyncTransport(httpx.AsyncBaseTransport):
    """Wraps another async transport and records chat completions made inside a rollout."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request = overridden(request)
        call = _prepare(request)
        response = await self._inner.handle_async_request(request)
        if call is None or response.status_code >= 400:
            return response
        if call.body.get("stream"):
            return _handed_on(response, stream=_RecordingAsyncStream(response, call))
        content = await response.aread()
        call.record_body(content)
        return _handed_on(response, content=content)

    async def aclose(self) -> None:
        await self._inner.aclose()


class CaptureTransport(httpx.BaseTransport):
    """The synchronous twin of `CaptureAsyncTransport`, for `openai.OpenAI` and sync LangChain."""

    def __init__(self, inner: httpx.BaseTransport | None = None) -> None:
        self._inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request = overridden(request)
        call = _prepare(request)
        response = self._inner.handle_request(request)
        if call is None or response.status_code >= 400:
            return response
        if call.body.get("stream"):
            return _handed_on(response, stream=_RecordingSyncStream(response, call))
        content = response.read()
        call.record_body(content)
        return _handed_on(response, content=content)

    def close(self) -> None:
        self._inner.close()

"""A real OpenAI-compatible HTTP server on loopback that answers scripted replies.

Used where the model on the other end is not what is under test: capture tests, and LiteLLM
judge/generator calls (RULER, AutoRL). Replies are taken in order; a reply is a string (content),
a dict (a full assistant message), or a callable of the request body returning either.
Every request body is kept in `requests` so tests can assert what was sent. Like the art-agents
server, it counts completions per rollout header and answers `GET /v1/art/rollouts/{id}`.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = str | dict[str, Any] | Callable[[dict[str, Any]], "str | dict[str, Any]"]


class QuietHTTPServer(ThreadingHTTPServer):
    """A test server that does not print "Exception occurred during processing of request" over pytest's output
    when a client hangs up mid-answer (a cancelled or timed-out request, which tests do on purpose)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LoopbackServer:
    """A QuietHTTPServer on a free loopback port: `start()` serves it from a daemon thread until `close()`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = QuietHTTPServer(("127.0.0.1", 0), handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self, poll_interval: float = 0.5) -> LoopbackServer:
        threading.Thread(target=self.httpd.serve_forever, args=(poll_interval,), daemon=True).start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ScriptedOpenAI:
    def __init__(self, replies: list[Reply] | None = None, *, model_suffix: str = "@0", delay_s: float = 0.0) -> None:
        self.replies: list[Reply] = list(replies or [])
        self.default: Reply = "ok"
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.rollout_counts: Counter[str] = Counter()
        self.model_suffix = model_suffix
        self.delay_s = delay_s
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._server = LoopbackServer(self._handler())

    @property
    def base_url(self) -> str:
        return f"{self._server.url}/v1"

    def __enter__(self) -> ScriptedOpenAI:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.close()

    def _next(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        with self._lock:
            reply = self.replies.pop(0) if self.replies else self.default
            completion_id = f"chatcmpl-{next(self._ids)}"
        if callable(reply):
            reply = reply(body)
        message = {"role": "assistant", "content": reply} if isinstance(reply, str) else {"role": "assistant", **reply}
        return completion_id, message

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: bytes, content_type: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                if self.path.startswith("/v1/art/rollouts/"):
                    count = server.rollout_counts[self.path.rsplit("/", 1)[1]]
                    self._send(200, json.dumps({"completions": count}).encode())
                    return
                self._send(
                    200, json.dumps({"object": "list", "data": [{"id": "scripted", "object": "model"}]}).encode()
                )

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                with server._lock:
                    server.requests.append(body)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    server.rollout_counts[self.headers.get("x-art-rollout-id", "")] += 1
                if server.delay_s:
                    time.sleep(server.delay_s)
                completion_id, message = server._next(body)
                model = f"{body.get('model', 'scripted')}{server.model_suffix}"
                finish = "tool_calls" if message.get("tool_calls") else "stop"
                if body.get("stream"):
                    self._stream(completion_id, model, message, finish)
                    return
                response = {
                    "id": completion_id,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }
                self._send(200, json.dumps(response).encode())

            def _stream(self, completion_id: str, model: str, message: dict[str, Any], finish: str) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                base = {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": model,
                }
                deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
                content = message.get("content") or ""
                deltas += [{"content": content[i : i + 3]} for i in range(0, len(content), 3)]
                for index, call in enumerate(message.get("tool_calls") or []):
                    arguments = call["function"]["arguments"]
                    half = len(arguments) // 2
                    head = {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": arguments[:half]},
                    }
                    deltas += [
                        {"tool_calls": [head]},
                        {"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]},
                    ]
                chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
                chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
                for chunk in chunks:
                    self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        return Handler

"""The HTTP face of the server: OpenAI-compatible chat completions and the versioned /v1/art routes.

Every refusal is a JSON `{"detail": ...}` with a 4xx status that says what to fix; a traceback
never reaches a client. With an API key set, every route but /health needs `Authorization: Bearer`.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from art_agents import wire
from art_agents.server.http.completions import StreamDelta, StreamItem
from art_agents.server.errors import ServiceError, describe, disk_full
from art_agents.server.model_sources import ModelSources
from art_agents.server.service import ArtService
from art_agents.wire import ROLLOUT_HEADER

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]
log = logging.getLogger("art_agents.server")


# Fields that would change what is sampled or its format, which this server cannot honour: refused by
# name unless given their neutral value, instead of being silently ignored.
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "top_k": ((None, 0, -1), "sampling is temperature and top_p only"),
    "min_p": ((None, 0, 0.0), "sampling is temperature and top_p only"),
    "presence_penalty": ((None, 0, 0.0), "no penalties are applied"),
    "frequency_penalty": ((None, 0, 0.0), "no penalties are applied"),
    "repetition_penalty": ((None, 1, 1.0), "no penalties are applied"),
    "logit_bias": ((None, {}), "logits are not biased"),
    "response_format": ((None, {"type": "text"}), "output is not constrained to a format; ask for JSON in the prompt"),
    "top_logprobs": ((None, 0), "only the sampled token's logprob is returned"),
    "functions": ((None, []), "use `tools`"),
    "function_call": ((None, "auto", "none"), "use `tools`"),
}


class ChatCompletionRequest(BaseModel):
    """The OpenAI chat completion fields this server honours; fields it cannot honour are refused by name.

    Limits keep one request from holding the engine: at most 4 stop strings of 256 characters, 128
    tools, `n` up to the model's batch size, a seed a 64-bit generator takes.
    """

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1, max_length=4096)
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)
    tool_choice: str | dict[str, Any] | None = None
    n: int | None = Field(None, ge=1, le=128)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = Field(None, max_length=4)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _honourable(self) -> ChatCompletionRequest:
        extra = self.model_extra or {}
        for name, (neutral, why) in UNSUPPORTED.items():
            if name in extra and extra[name] not in neutral:
                raise ValueError(f"{name}={extra[name]!r} is not supported by this server ({why}); leave it out")
        if self.tool_choice not in (None, "auto", "none"):
            raise ValueError(
                f"tool_choice={self.tool_choice!r} is not supported: the server cannot force a tool call; use 'auto'"
            )
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if any(len(stop) > 256 for stop in stops):
            raise ValueError("stop strings are limited to 256 characters each")
        if self.tools and len(json.dumps(self.tools)) > 256 * 1024:
            raise ValueError("tools are limited to 256 KB of JSON schema in all")
        return self


# Hand-written: Starlette's max_body_size (1.6+) answers a declared oversize body with a bare text/plain 413, without
# the hint below, and FastAPI's runs before the API-key check, so a stranger would get 413 instead of 401.
class _BodyLimit:
    """Refuses request bodies over `limit` bytes with a 413, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _too_large(self.limit)(scope, receive, send)
            return
        # Without a declared length the body is read here, up to the limit, then handed on.
        messages: list[Message] = []
        seen = 0
        while True:
            message = await receive()
            messages.append(message)
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await _too_large(self.limit)(scope, receive, send)
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


class _RequireKey:
    """`Authorization: Bearer <key>` on every route but /health, compared in constant time.

    Plain ASGI (not BaseHTTPMiddleware), so the routes still see a client that disconnects.
    """

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                refusal = JSONResponse(
                    {"detail": "missing or wrong API key; send 'Authorization: Bearer <key>'"}, status_code=401
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse(
        {"detail": f"request body over {limit} bytes; send fewer trajectory groups per call"}, status_code=413
    )


def create_app(
    art_path: str | Path,
    *,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    test_engines: bool = False,
    model_dirs: Sequence[str | Path] | None = None,
    serve_models: Sequence[wire.RegisterRequest] = (),
) -> FastAPI:
    """The server app. Without an `api_key` only loopback Host headers are served (a web page cannot
    reach it through DNS rebinding). With `model_dirs`, local base models must lie inside them (hub ids
    always load); None allows any folder. `serve_models` are registered at start-up (after the models
    already in `art_path` reopen). `test_engines` lets tests register the scripted engine."""
    service = ArtService(art_path, test_engines=test_engines, sources=ModelSources.of(model_dirs))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # TRL (~85 MB) is imported now, not by the first train call: the process reaches its size before serving
        await asyncio.to_thread(importlib.import_module, "trl.trainer.utils")
        await service.open_all()
        for request in serve_models:
            await service.register(request)
        yield
        await service.close()

    app = FastAPI(title="art-agents server", version="1", lifespan=lifespan)
    app.state.service = service

    # Starlette runs the last middleware added first: the key (or, without one, the Host check) and
    # then the body limit, so an unauthenticated request is refused before its body is read.
    app.add_middleware(_BodyLimit, limit=max_body_bytes)

    if api_key:
        app.add_middleware(_RequireKey, key=api_key)
    else:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()]
        return JSONResponse({"detail": "invalid request: " + "; ".join(problems)}, status_code=400)

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        if disk_full(exc):  # expected on a full disk, and only the operator can fix it: say so
            log.error("%s %s failed: %s", request.method, request.url.path, describe(exc))
            return JSONResponse({"detail": describe(exc)}, status_code=507)
        request_id = uuid.uuid4().hex[:12]  # the client gets the id, the log gets the details
        log.error("request %s (%s %s) failed", request_id, request.method, request.url.path, exc_info=exc)
        return JSONResponse(
            {"detail": f"internal server error; the server log has the details under request id {request_id}"},
            status_code=500,
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": {name: m.step for name, m in service.models.items()}}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        data = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "art-agents",
                "step": m.step,
                "served_as": m.served_as,
            }
            for name, m in service.models.items()
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(
        body: ChatCompletionRequest,
        http: Request,
        x_art_rollout_id: str | None = Header(None, alias=ROLLOUT_HEADER),
    ) -> Any:
        request = body.model_dump(exclude_none=True)
        if not body.stream:
            cancel = threading.Event()  # a client that hangs up stops its generation at the next token
            watcher = asyncio.create_task(_watch_disconnect(http, cancel))
            try:
                return await service.chat(request, x_art_rollout_id, cancel)
            finally:
                watcher.cancel()
        items = service.chat_stream(request, x_art_rollout_id)
        first = await anext(items)  # refusals raise here, before any 200 is sent
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_sse(first, items, include_usage), media_type="text/event-stream")

    @app.post(f"{wire.API_PREFIX}/models")
    async def register(body: wire.RegisterRequest) -> wire.ModelInfo:
        return await service.register(body)

    @app.get(f"{wire.API_PREFIX}/models/{{name}}/step")
    async def get_step(name: str) -> wire.StepInfo:
        return wire.StepInfo(step=service.get(name).step)

    @app.get(f"{wire.API_PREFIX}/models/{{name}}/checkpoints")
    async def checkpoints(name: str) -> list[wire.CheckpointInfo]:
        return service.list_checkpoints(name)

    @app.post(f"{wire.API_PREFIX}/models/{{name}}/checkpoints/delete")
    async def delete_checkpoints(name: str, body: wire.DeleteCheckpointsRequest) -> list[int]:
        return await service.delete_checkpoints(name, body)

    @app.post(f"{wire.API_PREFIX}/models/{{name}}/log")
    async def log_groups(name: str, body: wire.LogRequest) -> wire.LogResult:
        """Record evaluation groups (a split such as val) at the served step, without training."""
        return await service.log(name, body)

    @app.post(f"{wire.API_PREFIX}/models/{{name}}/train", response_model=None)
    async def train(name: str, body: wire.TrainRequest) -> StreamingResponse:
        """One GRPO step; NDJSON progress events, then a result or error event."""
        return await _ndjson(service.train(name, body))

    @app.post(f"{wire.API_PREFIX}/models/{{name}}/train_sft", response_model=None)
    async def train_sft(name: str, body: wire.TrainSFTRequest) -> StreamingResponse:
        """One supervised fine-tuning call on demonstrations; the same NDJSON events as train."""
        return await _ndjson(service.train_sft(name, body))

    @app.get(f"{wire.API_PREFIX}/rollouts/{{rollout_id}}")
    async def rollout_calls(rollout_id: str) -> dict[str, int]:
        return {"completions": service.rollouts.get(rollout_id)}

    return app


async def _ndjson(events: AsyncIterator[wire.TrainEvent]) -> StreamingResponse:
    """Stream train events as NDJSON; input errors raise from the first event, before any 200 is sent."""
    first = await anext(events)

    async def lines() -> AsyncIterator[str]:
        yield first.model_dump_json() + "\n"
        async for event in events:
            yield event.model_dump_json() + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def _watch_disconnect(request: Request, cancel: threading.Event, every_s: float = 0.25) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(every_s)
    cancel.set()


# Hand-written SSE: OpenAI's stream is bare `data:` lines ending in [DONE]; fastapi.sse streams only from generator
# routes (this one also answers JSON and refuses before the 200) and adds pings; sse-starlette is no server dependency.
def _chunk(completion_id: str, model: str, created: int, choices: list[dict[str, Any]], **extra: Any) -> str:
    body = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
        **extra,
    }
    return f"data: {json.dumps(body)}\n\n"


def _delta(index: int, **delta: Any) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": None}


async def _sse(first: StreamItem, items: AsyncIterator[StreamItem], include_usage: bool) -> AsyncIterator[str]:
    """OpenAI stream chunks: content as it is sampled, then tool calls and the finish of each choice."""
    created = int(time.time())
    sent: dict[int, str] = {}
    item = first
    try:
        while isinstance(item, StreamDelta):
            if item.choice not in sent:
                sent[item.choice] = ""
                yield _chunk(
                    item.completion_id, item.model, created, [_delta(item.choice, role="assistant", content="")]
                )
            yield _chunk(item.completion_id, item.model, created, [_delta(item.choice, content=item.text)])
            sent[item.choice] += item.text
            item = await anext(items)
    except Exception as exc:  # generation failed after the 200 went out: say so in the stream
        yield f"data: {json.dumps({'error': {'message': describe(exc), 'type': 'server_error'}})}\n\n"
        return
    response, _ = item
    head = (response["id"], response["model"], created)
    for choice in response["choices"]:
        index, message = choice["index"], choice["message"]
        if index not in sent:
            yield _chunk(*head, [_delta(index, role="assistant", content="")])
        rest = (message.get("content") or "")[len(sent.get(index, "")) :]
        if rest:
            yield _chunk(*head, [_delta(index, content=rest)])
        if message.get("tool_calls"):
            calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            yield _chunk(*head, [_delta(index, tool_calls=calls)])
        final = {
            "index": index,
            "delta": {},
            "finish_reason": choice["finish_reason"],
            "completion_id": choice["completion_id"],
            "token_ids": choice["token_ids"],
        }
        yield _chunk(*head, [final])
    if include_usage:
        yield _chunk(*head, [], usage=response["usage"])
    yield "data: [DONE]\n\n"

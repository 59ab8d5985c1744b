"""The HTTP face of the server: the app, its guards and error handling, and the two route families
(OpenAI chat in openai_routes.py; the Responses API, Anthropic Messages and legacy Completions in routers of
their own over server/formats/; the versioned /v1/art routes in art_routes.py), and rollout-scoped URLs.

Every refusal is JSON with a 4xx status that says what to fix (`{"detail": ...}`, or the protocol's own error
shape); a traceback never reaches a client. With an API key set, every route but /health needs
`Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.middleware.trustedhost import TrustedHostMiddleware

from art_agents import wire
from art_agents.server.errors import ServiceError, describe, disk_full
from art_agents.server.formats.errors import error_response, shape_of
from art_agents.server.http.art_routes import art_routes
from art_agents.server.http.guards import DEFAULT_MAX_BODY_BYTES, LOOPBACK_HOSTS, BodyLimit, RequireKey
from art_agents.server.http.messages_routes import messages_routes
from art_agents.server.http.openai_routes import openai_routes
from art_agents.server.http.responses_routes import responses_routes
from art_agents.server.http.rollout_scope import RolloutScope
from art_agents.server.http.text_completion_routes import text_completion_routes
from art_agents.server.models.model_sources import ModelSources
from art_agents.server.service import ArtService

log = logging.getLogger("art_agents.server")


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
    app.add_middleware(RolloutScope, rollouts=service.rollouts)
    app.add_middleware(BodyLimit, limit=max_body_bytes)

    if api_key:
        app.add_middleware(RequireKey, key=api_key)
    else:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return _refusal(request, exc.status, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()]
        return _refusal(request, 400, "invalid request: " + "; ".join(problems))

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

    app.include_router(openai_routes(service))
    app.include_router(responses_routes(service))
    app.include_router(messages_routes(service))
    app.include_router(text_completion_routes(service))
    app.include_router(art_routes(service))
    return app


def _refusal(request: Request, status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """`{"detail": ...}` on our own routes; the protocol's error shape on the Responses, Messages and Completions ones."""
    shape = shape_of(request.url.path)
    if shape is None:
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)
    return error_response(shape, status, detail, headers=headers)

"""The server's ASGI guards: a body-size limit and the API key, both answering JSON that says what to do."""

from __future__ import annotations

import secrets

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from art_agents.server.formats.errors import error_response, shape_of

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]


# Hand-written: Starlette's max_body_size (1.6+) answers a declared oversize body with a bare text/plain 413, without
# the hint below, and FastAPI's runs before the API-key check, so a stranger would get 413 instead of 401.
class BodyLimit:
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


class RequireKey:
    """`Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on every route but /health, compared in
    constant time.

    Plain ASGI (not BaseHTTPMiddleware), so the routes still see a client that disconnects.
    """

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.expected, self.key = app, f"Bearer {key}".encode(), key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health":
            headers = dict(scope["headers"])
            bearer = secrets.compare_digest(headers.get(b"authorization", b""), self.expected)
            if not bearer and not secrets.compare_digest(headers.get(b"x-api-key", b""), self.key):
                message = "missing or wrong API key; send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                shape = shape_of(scope["path"])
                refusal = (
                    JSONResponse({"detail": message}, 401) if shape is None else error_response(shape, 401, message)
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse(
        {"detail": f"request body over {limit} bytes; send fewer trajectory groups per call"}, status_code=413
    )

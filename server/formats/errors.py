"""Each protocol's own error body, so an SDK shows the server's reason rather than a parse failure."""

from __future__ import annotations

from typing import Literal

from fastapi.responses import JSONResponse

ErrorShape = Literal["openai", "anthropic"]

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_response(
    shape: ErrorShape, status: int, message: str, *, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    """OpenAI's `{"error": {message, type, param, code}}` or Anthropic's `{"type": "error", "error": {type, message}}`."""
    if shape == "anthropic":
        kind = _ANTHROPIC_TYPES.get(status, "api_error")
        return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status, headers=headers)
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status, headers=headers)


def shape_of(path: str) -> ErrorShape | None:
    """The error shape a route answers in; None for the routes that answer `{"detail": ...}`."""
    if path.endswith("/v1/messages"):
        return "anthropic"
    if path.endswith(("/v1/responses", "/v1/completions")) or "/v1/responses/" in path:
        return "openai"
    return None

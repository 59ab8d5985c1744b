"""Rollout-scoped base URLs: `/r/<rollout id>/v1/...` is `/v1/...` with that rollout's calls recorded.

An agent in another process or language is given only this base URL (and the key); every call it makes
through it, in any protocol, is kept for the rollout's assembly. A call to a rollout that was never opened
or has finished is refused by name, in the protocol's own error shape.
"""

from __future__ import annotations

import re

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from art_agents.server.errors import ServiceError
from art_agents.server.formats.errors import error_response, shape_of
from art_agents.server.serving.rollout_log import RolloutLog
from art_agents.wire import ROLLOUT_HEADER, ROLLOUT_PATH, ROLLOUT_RECORD_HEADER

_SCOPED = re.compile(rf"{ROLLOUT_PATH}/([A-Za-z0-9_.:-]{{1,128}})(/v1/.*)\Z")
_INFERENCE = ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/completions", "/v1/models")


class RolloutScope:
    def __init__(self, app: ASGIApp, rollouts: RolloutLog) -> None:
        self.app, self.rollouts = app, rollouts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(f"{ROLLOUT_PATH}/"):
            await self.app(scope, receive, send)
            return
        match = _SCOPED.match(scope["path"])
        if match is None or not match.group(2).startswith(_INFERENCE):
            refusal = JSONResponse(
                {
                    "detail": f"{scope['path']} is not a model route; a rollout-scoped URL serves {', '.join(_INFERENCE)}"
                },
                status_code=404,
            )
            await refusal(scope, receive, send)
            return
        rollout_id, path = match.groups()
        try:
            self.rollouts.check_open(rollout_id)
        except ServiceError as exc:
            shape = shape_of(path)
            refusal = JSONResponse({"detail": exc.detail}, exc.status) if shape is None else None
            await (refusal or error_response(shape, exc.status, exc.detail))(scope, receive, send)  # type: ignore[arg-type]
            return
        ours = (ROLLOUT_HEADER.encode(), ROLLOUT_RECORD_HEADER.encode())
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in ours]
        headers += [(ours[0], rollout_id.encode()), (ours[1], b"1")]
        await self.app({**scope, "path": path, "raw_path": path.encode(), "headers": headers}, receive, send)

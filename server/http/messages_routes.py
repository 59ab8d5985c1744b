"""Anthropic's Messages API, `POST /v1/messages` (JSON or its server-sent events), over the chat engine call.

The format lives in server/formats/anthropic_messages.py; refusals are raised before the first stream byte and
answered in Anthropic's error shape by the app. `anthropic-version` and `anthropic-beta` headers are accepted and
ignored; `x-api-key` is checked by the app's key guard.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse

from art_agents.server.formats.anthropic_messages import (
    MessagesRequest,
    chat_body,
    message_events,
    message_of,
)
from art_agents.server.http.disconnect import watched
from art_agents.server.service import ArtService
from art_agents.wire import ROLLOUT_HEADER, ROLLOUT_RECORD_HEADER

T = TypeVar("T")


def messages_routes(service: ArtService) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages", response_model=None)
    async def messages(
        body: MessagesRequest,
        http: Request,
        x_art_rollout_id: str | None = Header(None, alias=ROLLOUT_HEADER),
        x_art_rollout_record: str | None = Header(None, alias=ROLLOUT_RECORD_HEADER),
    ) -> Any:
        record = bool(x_art_rollout_record)
        planned = await service.plan_chat(chat_body(body), x_art_rollout_id, protocol="messages", record=record)
        plan = planned.keyed("msg_")
        if not body.stream:
            return message_of(plan, await watched(http, plan, service.run(plan)))
        items = service.run_stream(plan)
        first = await watched(http, plan, anext(items))  # a busy engine answers 503 here, before any 200
        return StreamingResponse(message_events(plan, first, items), media_type="text/event-stream")

    return router

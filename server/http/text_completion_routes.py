"""Legacy OpenAI Completions, `POST /v1/completions` (JSON or a server-sent event stream), over the chat engine path.

Fields this server cannot honour are refused by name, as on the chat route; refusals come before the first
stream byte, in OpenAI's error shape (the app maps them).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse

from art_agents.server.formats.text_completions import (
    TextCompletionRequest,
    plan_text_completion,
    text_completion,
    text_completion_events,
)
from art_agents.server.http.disconnect import watched
from art_agents.server.service import ArtService
from art_agents.server.serving.completions import ChatPlan
from art_agents.wire import ROLLOUT_HEADER, ROLLOUT_RECORD_HEADER


def text_completion_routes(service: ArtService) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/completions", response_model=None)
    async def completions(
        body: TextCompletionRequest,
        http: Request,
        x_art_rollout_id: str | None = Header(None, alias=ROLLOUT_HEADER),
        x_art_rollout_record: str | None = Header(None, alias=ROLLOUT_RECORD_HEADER),
    ) -> Any:
        plan = await _plan(service, body.model_dump(exclude_none=True), x_art_rollout_id, bool(x_art_rollout_record))
        if not body.stream:
            response, _ = await watched(http, plan, service.run(plan))
            return text_completion(response, body.logprobs)
        items = service.run_stream(plan)
        first = await anext(items)  # a failure to start generating raises here, before any 200 is sent
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        events = text_completion_events(first, items, body.logprobs, include_usage)
        return StreamingResponse(events, media_type="text/event-stream")

    return router


async def _plan(service: ArtService, body: dict[str, Any], rollout_id: str | None, record: bool) -> ChatPlan:
    """As `ArtService.plan_chat`, for a prompt that is not chat messages."""
    served, older = service.resolve(body["model"])
    plan = await asyncio.to_thread(plan_text_completion, served, body, rollout_id, older)
    if record and rollout_id:
        service.rollouts.start_keeping(rollout_id)
    return plan

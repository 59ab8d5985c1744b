"""The OpenAI-compatible routes: /v1/models and /v1/chat/completions (JSON or a server-sent event stream).

The request model and the stream's chunks are in server/formats/chat.py.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse

from art_agents.server.formats.chat import ChatCompletionRequest, chat_chunks
from art_agents.server.http.disconnect import watch_disconnect
from art_agents.server.service import ArtService
from art_agents.wire import ROLLOUT_HEADER, ROLLOUT_RECORD_HEADER


def openai_routes(service: ArtService) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
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

    @router.post("/v1/chat/completions", response_model=None)
    async def chat_completions(
        body: ChatCompletionRequest,
        http: Request,
        x_art_rollout_id: str | None = Header(None, alias=ROLLOUT_HEADER),
        x_art_rollout_record: str | None = Header(None, alias=ROLLOUT_RECORD_HEADER),
    ) -> Any:
        request = body.model_dump(exclude_none=True)
        record = bool(x_art_rollout_record)
        if not body.stream:
            cancel = threading.Event()  # a client that hangs up stops its generation at the next token
            watcher = asyncio.create_task(watch_disconnect(http, cancel))
            try:
                return await service.chat(request, x_art_rollout_id, cancel, record)
            finally:
                watcher.cancel()
        items = service.chat_stream(request, x_art_rollout_id, record)
        first = await anext(items)  # refusals raise here, before any 200 is sent
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(chat_chunks(first, items, include_usage), media_type="text/event-stream")

    return router

"""The OpenAI Responses API, `POST /v1/responses` (JSON or a stream of events), over the chat engine call.

The format lives in server/formats/responses.py; this route plans through the service like the chat route
(refusals raise before the first stream byte, a client that hangs up stops its generation, the rollout headers
record the call, as protocol "responses") and keeps recent conversations for `previous_response_id`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import APIRouter, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from art_agents.server.formats.chat import ChatCompletionRequest
from art_agents.server.formats.response_store import Conversations
from art_agents.server.formats.responses import (
    ResponsesRequest,
    chat_body,
    input_messages,
    stream_events,
    to_response,
)
from art_agents.server.http.disconnect import watched
from art_agents.server.service import ArtService
from art_agents.wire import ROLLOUT_HEADER, ROLLOUT_RECORD_HEADER

T = TypeVar("T")


def responses_routes(service: ArtService) -> APIRouter:
    router = APIRouter()
    conversations = Conversations()

    @router.post("/v1/responses", response_model=None)
    async def create_response(
        body: ResponsesRequest,
        http: Request,
        x_art_rollout_id: str | None = Header(None, alias=ROLLOUT_HEADER),
        x_art_rollout_record: str | None = Header(None, alias=ROLLOUT_RECORD_HEADER),
    ) -> Any:
        turns = [*conversations.history(body.previous_response_id), *input_messages(body.input)]
        chat = _checked(chat_body(body, turns))
        record = bool(x_art_rollout_record)
        planned = await service.plan_chat(chat, x_art_rollout_id, protocol="responses", record=record)
        plan = planned.keyed("resp_")

        def finish(completion: dict[str, Any]) -> dict[str, Any]:
            response = to_response(body, completion)
            if body.store is not False:
                conversations.keep(response["id"], [*turns, completion["choices"][0]["message"]])
            return response

        if not body.stream:
            completion, _ = await watched(http, plan, service.run(plan))
            return finish(completion)
        items = service.run_stream(plan)
        first = await watched(http, plan, anext(items))  # a busy engine answers 503 here, before any 200
        return StreamingResponse(stream_events(body, first, items, finish), media_type="text/event-stream")

    return router


def _checked(chat: dict[str, Any]) -> dict[str, Any]:
    """The chat route's limits (messages, tools) hold for the chat form of a Responses request too."""
    try:
        ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:  # answered as any invalid request is, in OpenAI's error shape
        raise RequestValidationError(exc.errors()) from exc
    return chat

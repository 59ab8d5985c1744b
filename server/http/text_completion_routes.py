"""Legacy OpenAI Completions, `POST /v1/completions` (JSON or a server-sent event stream), over the chat engine path.

Fields this server cannot honour are refused by name, as on the chat route; refusals come before the first
stream byte, in OpenAI's error shape (the app maps them).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from art_agents.server.completions import ChatPlan
from art_agents.server.formats.text_completions import plan_text_completion, text_completion, text_completion_events
from art_agents.server.http.openai_routes import UNSUPPORTED, watch_disconnect
from art_agents.server.service import ArtService
from art_agents.wire import ROLLOUT_HEADER, ROLLOUT_RECORD_HEADER

# The completion fields beyond the chat ones that change what is returned, refused unless neutral.
_UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    **UNSUPPORTED,
    "echo": ((None, False), "the prompt is not returned with the completion; prepend it yourself"),
    "suffix": ((None, ""), "text after the completion (insertion) is not supported"),
}

Stop = Annotated[str, StringConstraints(max_length=256)]


class TextCompletionRequest(BaseModel):
    """The legacy completion fields this server honours; limits as on the chat route."""

    model_config = ConfigDict(extra="allow")

    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    n: int | None = Field(None, ge=1, le=128)
    best_of: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: Stop | list[Stop] | None = Field(None, max_length=4)
    seed: int | None = Field(None, ge=0, lt=2**63)
    logprobs: int | None = Field(None, ge=0)
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _honourable(self) -> TextCompletionRequest:
        extra = self.model_extra or {}
        for name, (neutral, why) in _UNSUPPORTED.items():
            if name in extra and extra[name] not in neutral:
                raise ValueError(f"{name}={extra[name]!r} is not supported by this server ({why}); leave it out")
        if self.logprobs is not None and self.logprobs > 1:
            raise ValueError(
                f"logprobs={self.logprobs} is not supported: only the sampled token's logprob is returned; use 0 or 1"
            )
        if self.best_of not in (None, self.n or 1):
            raise ValueError(
                f"best_of={self.best_of} is not supported: every sampled completion is returned; leave it out or "
                "set it equal to n"
            )
        return self


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
            cancel = threading.Event()  # a client that hangs up stops its generation at the next token
            watcher = asyncio.create_task(watch_disconnect(http, cancel))
            try:
                response, _ = await service.run(plan, cancel)
            finally:
                watcher.cancel()
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

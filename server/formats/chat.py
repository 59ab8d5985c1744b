"""OpenAI Chat Completions: the request fields this server honours, and its stream of chunks.

Fields this server cannot honour are refused by name instead of being silently ignored; other protocols'
formats reuse the same table for the sampling fields they share.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from art_agents.server.errors import describe
from art_agents.server.formats.refusals import Refusals, refuse_forced_tool, refuse_unless_neutral
from art_agents.server.serving.completions import StreamDelta, StreamItem

# Fields that would change what is sampled or its format, which this server cannot honour: refused by
# name unless given their neutral value, instead of being silently ignored.
UNSUPPORTED: Refusals = {
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
        refuse_unless_neutral(self.model_extra or {}, UNSUPPORTED)
        refuse_forced_tool(self.tool_choice)
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if any(len(stop) > 256 for stop in stops):
            raise ValueError("stop strings are limited to 256 characters each")
        if self.tools and len(json.dumps(self.tools)) > 256 * 1024:
            raise ValueError("tools are limited to 256 KB of JSON schema in all")
        return self


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


async def chat_chunks(first: StreamItem, items: AsyncIterator[StreamItem], include_usage: bool) -> AsyncIterator[str]:
    """OpenAI stream chunks: content as it is sampled, then tool calls and the finish of each choice (with its logprobs)."""
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
            "logprobs": choice["logprobs"],  # every token's at once, as the reply without streaming has them
            "completion_id": choice["completion_id"],
            "token_ids": choice["token_ids"],
        }
        yield _chunk(*head, [final])
    if include_usage:
        yield _chunk(*head, [], usage=response["usage"])
    yield "data: [DONE]\n\n"

"""Legacy OpenAI Completions (`POST /v1/completions`): a raw prompt in, text out, on the chat path below.

No chat template is applied. A string prompt is tokenized the way the served tokenizer does by default, so
with the special tokens it adds itself (Llama's BOS; none for Qwen), as vLLM does; a prompt of token ids is
taken as it is. The call becomes a `ChatPlan` whose `messages` hold the prompt as one user message, the chat
form the rollout log keeps, so gating, `name@step`, the token store and rollout capture are the chat path's.
The engines keep only the sampled token's logprob: `logprobs` 0 or 1 is honoured, with `top_logprobs` listing
that token (the entry the API always adds), never other alternatives.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from art_agents.server.engines.protocol import OlderStep
from art_agents.server.errors import ServiceError, describe
from art_agents.server.formats.chat import UNSUPPORTED
from art_agents.server.formats.refusals import Refusals, refuse_unless_neutral
from art_agents.server.serving.completions import ChatPlan, StreamDelta, StreamItem, check_fits, sampling_params
from art_agents.server.serving.served_model import ServedModel

Prompt = str | list[int]


# The completion fields beyond the chat ones that change what is returned, refused unless neutral.
_UNSUPPORTED: Refusals = {
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
        refuse_unless_neutral(self.model_extra or {}, _UNSUPPORTED)
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


def plan_text_completion(
    served: ServedModel, body: dict[str, Any], rollout_id: str | None, older: OlderStep | None = None
) -> ChatPlan:
    """Validate a completion request and tokenize its prompt; refusals are `ServiceError`s (run in a worker thread)."""
    params = sampling_params(served, body)
    prompt = _single(body["prompt"])
    prompt_ids = prompt if isinstance(prompt, list) else _tokenized(served, prompt)
    if not prompt_ids:
        raise ServiceError(400, "prompt is empty; give at least one token to continue")
    check_fits(served, len(prompt_ids), params.max_tokens, "the prompt")
    if isinstance(prompt, list):  # after the context check, which bounds the scan
        _check_vocabulary(served, prompt)
    text = prompt if isinstance(prompt, str) else served.engine.tokenizer.decode(prompt_ids)
    return ChatPlan(
        served,
        prompt_ids,
        params,
        tools=None,
        completion_id=f"cmpl-{uuid.uuid4().hex}",
        rollout_id=rollout_id,
        older=older,
        messages=[{"role": "user", "content": text}],
        protocol="completions",
    )


def _single(prompt: Prompt | list[str] | list[list[int]]) -> Prompt:
    """The one prompt of a request: a batch of several is refused (one token-store plan per request)."""
    if not prompt or isinstance(prompt, str) or isinstance(prompt[0], int):
        return prompt  # type: ignore[return-value]
    if len(prompt) > 1:
        raise ServiceError(
            400,
            f"prompt: a batch of {len(prompt)} prompts is not supported; send one prompt per request "
            "(use n for several completions of the same prompt)",
        )
    return prompt[0]


def _tokenized(served: ServedModel, prompt: str) -> list[int]:
    """The string's ids, refused unread when its bytes cannot fit the context at the longest token's size."""
    limit = served.context_tokens
    size = len(prompt.encode())
    if limit is not None and size > limit * served.engine.longest_token_bytes:
        raise ServiceError(
            400, f"the prompt ({size} bytes) cannot fit the model's context of {limit} tokens; shorten it"
        )
    return list(served.engine.tokenizer(prompt)["input_ids"])


def _check_vocabulary(served: ServedModel, ids: list[int]) -> None:
    vocabulary = len(served.engine.tokenizer)
    if (bad := next((t for t in ids if not 0 <= t < vocabulary), None)) is not None:
        raise ServiceError(
            400,
            f"prompt: token id {bad} is outside the vocabulary of {served.info.base_model} (ids 0-{vocabulary - 1})",
        )


def text_completion(response: dict[str, Any], logprobs: int | None) -> dict[str, Any]:
    """The chat result as a `text_completion`, with the token-store key (`completion_id`) and each choice's tokens."""
    return {
        "id": response["id"],
        "object": "text_completion",
        "created": response["created"],
        "model": response["model"],
        "choices": [_choice(choice, logprobs) for choice in response["choices"]],
        "usage": response["usage"],
        "completion_id": response["id"],
    }


def _choice(choice: dict[str, Any], logprobs: int | None) -> dict[str, Any]:
    return {
        "index": choice["index"],
        "text": choice["message"]["content"] or "",
        "finish_reason": choice["finish_reason"],
        "logprobs": None if logprobs is None else _legacy_logprobs(choice["logprobs"]["content"], logprobs),
        "completion_id": choice["completion_id"],
        "token_ids": choice["token_ids"],
    }


def _legacy_logprobs(content: list[dict[str, Any]], top: int) -> dict[str, Any]:
    """Chat's per-token logprobs in the legacy shape; `text_offset` counts from the completion's first character."""
    tokens = [entry["token"] for entry in content]
    return {
        "tokens": tokens,
        "token_logprobs": [entry["logprob"] for entry in content],
        "top_logprobs": [{entry["token"]: entry["logprob"]} for entry in content] if top else None,
        "text_offset": [0, *itertools.accumulate(len(token) for token in tokens)][: len(tokens)],
    }


async def text_completion_events(
    first: StreamItem, items: AsyncIterator[StreamItem], logprobs: int | None, include_usage: bool
) -> AsyncIterator[str]:
    """Legacy stream chunks: text as it is sampled, then each choice's finish with its logprobs and tokens, `[DONE]`.

    A choice's logprobs come whole in its last chunk (earlier chunks carry none), so concatenating them across
    chunks gives every token's.
    """
    created = int(time.time())
    sent: dict[int, str] = {}
    item = first
    try:
        while isinstance(item, StreamDelta):
            sent[item.choice] = sent.get(item.choice, "") + item.text
            text = {"index": item.choice, "text": item.text, "logprobs": None, "finish_reason": None}
            yield _chunk(item.completion_id, item.model, created, [text])
            item = await anext(items)
    except Exception as exc:  # generation failed after the 200 went out: say so in the stream
        yield f"data: {json.dumps({'error': {'message': describe(exc), 'type': 'server_error'}})}\n\n"
        return
    reply = text_completion(item[0], logprobs)
    for choice in reply["choices"]:
        rest = choice["text"][len(sent.get(choice["index"], "")) :]
        yield _chunk(reply["id"], reply["model"], created, [{**choice, "text": rest}])
    if include_usage:
        yield _chunk(reply["id"], reply["model"], created, [], usage=reply["usage"])
    yield "data: [DONE]\n\n"


def _chunk(completion_id: str, model: str, created: int, choices: list[dict[str, Any]], **extra: Any) -> str:
    body = {"id": completion_id, "object": "text_completion", "created": created, "model": model, "choices": choices}
    return f"data: {json.dumps({**body, **extra})}\n\n"

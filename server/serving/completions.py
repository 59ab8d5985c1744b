"""Chat completions: validate and render a request, generate, record the tokens, answer in OpenAI's shape.

Every choice is recorded in the model's token store before its completion id reaches the client,
so training can later use exactly the sampled tokens and their sampler logprobs.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from art_agents.server.engines.protocol import EngineBusy, OlderStep, Sample, SamplingParams, TokenCallback
from art_agents.server.engines.stream_text import IncrementalText
from art_agents.server.errors import ServiceError
from art_agents.server.models.chat_format import oversized, parse_assistant, render_prompt_ids
from art_agents.server.serving.rollout_log import RolloutLog
from art_agents.server.serving.served_model import ServedModel
from art_agents.server.storage.token_store import TokenRecord
from art_agents.wire import RolloutCall

Completed = tuple[dict[str, Any], list[Sample]]
Spawn = Callable[[Coroutine[Any, Any, Completed]], "asyncio.Task[Completed]"]


@dataclass
class StreamDelta:
    """Text of one choice that is certain to be in the answer, sent before the completion ends."""

    choice: int
    text: str
    completion_id: str
    model: str


StreamItem = StreamDelta | Completed
Protocol = Literal["chat", "responses", "messages", "completions"]


@dataclass
class ChatPlan:
    """A validated chat request: what to sample, from which model, under which completion id."""

    served: ServedModel
    prompt_ids: list[int]
    params: SamplingParams
    tools: list[dict[str, Any]] | None
    completion_id: str
    rollout_id: str | None
    older: OlderStep | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the request in chat form, for the rollout log
    protocol: Protocol = "chat"
    started: float = field(default_factory=time.perf_counter)
    started_at: float = field(default_factory=time.time)

    def keyed(self, prefix: str) -> ChatPlan:
        """The plan with its tokens kept under the protocol's own reply id (`resp_...`, `msg_...`): the id any client
        of that protocol reports (LangChain's response metadata, say) is then the token-store key, so a capture that
        knows it trains on the exact tokens."""
        self.completion_id = f"{prefix}{self.completion_id.removeprefix('chatcmpl-')}"
        return self

    @property
    def served_as(self) -> str:
        """`name@step` of the checkpoint this request samples from."""
        step = self.served.step if self.older is None else self.older.step
        return f"{self.served.info.name}@{step}"


def plan_chat(
    served: ServedModel, body: dict[str, Any], rollout_id: str | None, older: OlderStep | None = None
) -> ChatPlan:
    """Validate a chat request and render its prompt; refusals are `ServiceError`s.

    Cheap checks come before the chat template and the tokenizer, and callers run this in a worker
    thread: a huge request is refused at once and never holds the event loop.
    """
    params = sampling_params(served, body)
    limit = served.context_tokens
    tokenizer = served.engine.tokenizer
    if (size := oversized(body["messages"], limit, served.engine.longest_token_bytes)) is not None:
        raise ServiceError(
            400, f"the messages ({size} bytes) cannot fit the model's context of {limit} tokens; shorten them"
        )
    tools = body.get("tools") if body.get("tool_choice") != "none" else None
    template_kwargs = body.get("chat_template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise ServiceError(400, 'chat_template_kwargs must be an object, e.g. {"enable_thinking": false}')
    try:
        prompt_ids = render_prompt_ids(tokenizer, body["messages"], tools, template_kwargs)
    except Exception as exc:  # jinja errors: a message shape the chat template rejects
        if not getattr(tokenizer, "chat_template", None):
            raise ServiceError(
                400,
                f"{served.info.base_model} has no chat template, so chat messages cannot be rendered; give its "
                "tokenizer one (chat_template.jinja beside tokenizer_config.json), e.g. its instruct model's",
            ) from exc
        raise ServiceError(400, f"the chat template could not render these messages: {exc}") from exc
    check_fits(served, len(prompt_ids), params.max_tokens, "the conversation")
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    return ChatPlan(served, prompt_ids, params, tools, completion_id, rollout_id, older, messages=body["messages"])


def sampling_params(served: ServedModel, body: dict[str, Any]) -> SamplingParams:
    """The sampling fields every protocol shares, with the model's defaults; `n` is bounded by its batch size."""
    config = served.info.config
    params = SamplingParams(
        max_tokens=body.get("max_completion_tokens") or body.get("max_tokens") or config.default_max_tokens,
        n=body.get("n") or 1,
        temperature=1.0 if body.get("temperature") is None else body["temperature"],
        top_p=1.0 if body.get("top_p") is None else body["top_p"],
        stop=[body["stop"]] if isinstance(body.get("stop"), str) else list(body.get("stop") or []),
        seed=body.get("seed"),
    )
    if params.n > config.max_batch_size:
        raise ServiceError(400, f"n={params.n} exceeds this model's max_batch_size ({config.max_batch_size})")
    return params


def check_fits(served: ServedModel, prompt_tokens: int, max_tokens: int, shorten: str) -> None:
    """Refuse a prompt that leaves no room for `max_tokens` in the model's context; `shorten` names what to cut."""
    limit = served.context_tokens
    if limit is not None and prompt_tokens + max_tokens > limit:
        raise ServiceError(
            400,
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the model's context "
            f"of {limit} tokens; shorten {shorten} or lower max_tokens",
        )


async def stream_completion(plan: ChatPlan, rollouts: RolloutLog, spawn: Spawn) -> AsyncIterator[StreamItem]:
    """`StreamDelta`s as tokens are sampled, then the recorded `(response, samples)`.

    Content is streamed as it is generated, minus any tail that could still turn into a stop
    string; with tools, the message is sent once it can be parsed. The completion is generated and
    recorded by a task of its own (`spawn`); a client that hangs up mid-stream stops the generation at
    the next token, and what was sampled is still recorded under its completion id.
    """
    loop = asyncio.get_running_loop()
    tokens: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()

    def on_token(choice: int, token: int) -> None:
        loop.call_soon_threadsafe(tokens.put_nowait, (choice, token))

    task = spawn(complete(plan, rollouts, None if plan.tools else on_token))
    task.add_done_callback(lambda _: tokens.put_nowait(None))
    try:
        if not plan.tools:
            decoders = [IncrementalText(plan.served.engine.tokenizer, plan.params.stop) for _ in range(plan.params.n)]
            while (item := await tokens.get()) is not None:
                choice, token = item
                if text := decoders[choice].push(token):  # the step is fixed while a batch runs
                    yield StreamDelta(choice, text, plan.completion_id, plan.served_as)
        yield await task
    finally:
        if not task.done():  # the client went away (the stream was closed before the end)
            plan.cancel.set()


async def complete(plan: ChatPlan, rollouts: RolloutLog, on_token: TokenCallback | None = None) -> Completed:
    """Generate, record every choice in the token store, count the rollout's call, build the response."""
    served = plan.served
    try:
        samples = await served.engine.generate(
            plan.prompt_ids, plan.params, on_token, plan.older, plan.cancel, route=plan.rollout_id
        )
    except EngineBusy as exc:
        raise ServiceError(503, str(exc), {"Retry-After": "1"}) from exc
    ids = [plan.completion_id if i == 0 else f"{plan.completion_id}-{i}" for i in range(len(samples))]
    records = [
        TokenRecord(
            completion_id=cid,
            model=served.info.name,
            policy_step=s.step,
            prompt_ids=plan.prompt_ids,
            completion_ids=s.token_ids,
            logprobs=s.logprobs,
            temperature=s.temperature,
            top_p=plan.params.top_p,
        )
        for cid, s in zip(ids, samples, strict=True)
    ]
    await asyncio.to_thread(served.store.add_many, records)  # on disk before the id is complete anywhere
    choices = [_choice(plan, index, cid, sample) for index, (cid, sample) in enumerate(zip(ids, samples, strict=True))]
    completion_tokens = sum(len(s.token_ids) for s in samples)
    usage = {
        "prompt_tokens": len(plan.prompt_ids),
        "completion_tokens": completion_tokens,
        "total_tokens": len(plan.prompt_ids) + completion_tokens,
    }
    model = f"{served.info.name}@{samples[0].step}"
    if plan.rollout_id and rollouts.keeps(plan.rollout_id):
        call = RolloutCall(
            protocol=plan.protocol,
            messages=plan.messages,
            message=choices[0]["message"],
            tools=plan.tools,
            completion_id=plan.completion_id,
            model=model,
            finish_reason=choices[0]["finish_reason"],
            usage=usage,
            latency_s=time.perf_counter() - plan.started,
            started_at=plan.started_at,
        )
        rollouts.add(plan.rollout_id, call)
    elif plan.rollout_id:
        rollouts.add(plan.rollout_id)
    response = {
        "id": plan.completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }
    return response, samples


def _choice(plan: ChatPlan, index: int, completion_id: str, sample: Sample) -> dict[str, Any]:
    """One OpenAI choice, plus `completion_id` and `token_ids` for the client's capture."""
    tokenizer = plan.served.engine.tokenizer
    if plan.tools:  # tool calls, and the family's reasoning, in fields of their own
        ids = None if plan.params.stop else sample.token_ids  # a stop string cut the text, not the tokens
        message = parse_assistant(tokenizer, sample.text, ids, plan.prompt_ids, plan.tools)
    else:
        message = {"role": "assistant", "content": sample.text}
    tool_finish = message.get("tool_calls") and sample.finish_reason == "stop"
    logprobs = [_token_logprob(tokenizer, t, lp) for t, lp in zip(sample.token_ids, sample.logprobs, strict=True)]
    return {
        "index": index,
        "message": message,
        "finish_reason": "tool_calls" if tool_finish else sample.finish_reason,
        "logprobs": {"content": logprobs},
        "completion_id": completion_id,
        "token_ids": sample.token_ids,
    }


def _token_logprob(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8")), "top_logprobs": []}

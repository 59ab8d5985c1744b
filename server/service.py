"""The server's state and operations, independent of HTTP: models, chat completions, training.

One `ServedModel` per registered model: its folder, engine, token store and a lock that
serialises training. Training pauses the engine (requests that arrive meanwhile wait), runs
`PolicyTrainer.train` in a worker thread on the served PEFT model, saves checkpoint N+1 and then
serves step N+1, so a failed step leaves the last checkpoint serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_agents.jsonl import write_groups
from art_agents.server.chat_format import parse_assistant, render_prompt_ids
from art_agents.server.engine import Engine, Sample, SamplingParams
from art_agents.server.token_store import TokenRecord, TokenStore
from art_agents.train_config import ModelConfig
from art_agents.wire import CheckpointInfo, ModelInfo, RegisterRequest, TrainEvent, TrainRequest, TrainResult

log = logging.getLogger("art_agents.server")

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_STEP_SUFFIX = re.compile(r"@\d+$")


class ServiceError(Exception):
    """A request the server refuses; `status` is the HTTP status, the message says what to fix."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def check_name(value: str, what: str = "model name") -> str:
    if not _SAFE_NAME.match(value) or ".." in value:
        raise ServiceError(
            400,
            f"{what} {value!r} is not allowed: use letters, digits, '_', '-' and '.', at most 128 characters, "
            "no '/' and no '..' (it becomes a folder name)",
        )
    return value


@dataclass
class StreamDelta:
    choice: int
    text: str
    completion_id: str
    model: str


StreamItem = StreamDelta | tuple[dict[str, Any], list[Sample]]


class _IncrementalText:
    """Decodes one choice token by token, holding back what a stop string or a split character may change."""

    def __init__(self, tokenizer: Any, stop: list[str]) -> None:
        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.ids: list[int] = []
        self.sent = 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""  # a multi-byte character is not complete yet
        if any(s in text[max(0, self.sent - len(s)) :] for s in self.stop):
            return ""  # a stop string ended the choice; the final message has the exact text
        safe = len(text) - max((_overlap(text, s) for s in self.stop), default=0)
        piece, self.sent = text[self.sent : safe], max(self.sent, safe)
        return piece


def _overlap(text: str, stop: str) -> int:
    """Length of the longest tail of `text` that is a head of `stop`."""
    return next((k for k in range(min(len(text), len(stop) - 1), 0, -1) if stop.startswith(text[-k:])), 0)


@dataclass
class _ChatPlan:
    served: ServedModel
    prompt_ids: list[int]
    params: SamplingParams
    tools: list[dict[str, Any]] | None
    completion_id: str


@dataclass
class ServedModel:
    info: ModelInfo
    model_dir: Path
    engine: Engine
    store: TokenStore
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def step(self) -> int:
        return self.engine.step


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load_engine(base_model: str, config: ModelConfig) -> Engine:
    if config.engine == "transformers":
        from art_agents.server.engine import TransformersEngine

        return TransformersEngine.load(base_model, config)
    if config.engine == "scripted":
        from art_agents.server.scripted_engine import ScriptedEngine

        return ScriptedEngine.load(base_model, config)
    raise ServiceError(400, f"engine {config.engine!r} is not available in this server; use engine='transformers'")


class ArtService:
    """Every model under `art_path`, reopened at startup from their model.json files."""

    def __init__(self, art_path: str | Path) -> None:
        self.art_path = Path(art_path).resolve()
        self.models: dict[str, ServedModel] = {}
        self.rollouts: Counter[str] = Counter()
        self._register_lock = asyncio.Lock()
        self._background: set[asyncio.Task[Any]] = set()  # work that must outlive a closed response stream

    # --- models ---------------------------------------------------------------------------

    def model_dir(self, project: str, name: str) -> Path:
        return self.art_path / project / "models" / name

    async def open_all(self) -> None:
        for path in sorted(self.art_path.glob("*/models/*/model.json")):
            try:
                request = RegisterRequest.model_validate_json(path.read_text(encoding="utf-8"))
                await self.register(request)
            except Exception:  # one broken model must not keep the others from being served
                log.exception("could not reopen the model in %s; it is not served", path.parent)

    async def register(self, request: RegisterRequest) -> ModelInfo:
        check_name(request.name)
        check_name(request.project, "project")
        async with self._register_lock:
            served = self.models.get(request.name)
            if served is not None:
                if served.info.project != request.project:
                    raise ServiceError(
                        409,
                        f"model {request.name!r} already exists in project {served.info.project!r}; pick another name",
                    )
                return served.info.model_copy(update={"step": served.step})
            served = await asyncio.to_thread(self._open, request)
            self.models[request.name] = served
            return served.info

    def _open(self, request: RegisterRequest) -> ServedModel:
        from art_agents.server.checkpoints import checkpoint_path, latest_step, save_checkpoint

        model_dir = self.model_dir(request.project, request.name)
        meta = model_dir / "model.json"
        if meta.exists():  # the stored registration wins: config is fixed at registration
            request = RegisterRequest.model_validate_json(meta.read_text(encoding="utf-8"))
        try:
            engine = _load_engine(request.base_model, request.config)
        except ServiceError:
            raise
        except Exception as exc:
            raise ServiceError(
                400,
                f"cannot load base_model {request.base_model!r}: {type(exc).__name__}: {exc}; give a local folder "
                "with a transformers model (e.g. one made by `art-agents tiny-model PATH`) or a cached hub id",
            ) from exc
        step = latest_step(model_dir)
        if step is None:
            step = 0
            save_checkpoint(model_dir, 0, engine.model, None, {"initialised_with_seed": request.config.seed})
        else:
            engine.load_adapter(checkpoint_path(model_dir, step))
        engine.step = step
        _write_json_atomic(meta, request.model_dump(mode="json"))
        store = TokenStore(model_dir / "tokens" / "store.sqlite")
        info = ModelInfo(
            name=request.name, project=request.project, base_model=request.base_model, step=step, config=request.config
        )
        log.info("serving %s@%d from %s", request.name, step, model_dir)
        return ServedModel(info=info, model_dir=model_dir, engine=engine, store=store)

    def get(self, name: str) -> ServedModel:
        check_name(name)
        served = self.models.get(name)
        if served is None:
            known = ", ".join(sorted(self.models)) or "none"
            raise ServiceError(
                404, f"model {name!r} is not registered on this server (registered: {known}); register it first"
            )
        return served

    def resolve(self, model_field: str) -> ServedModel:
        """A chat request's `model`: `name` or `name@step` (the latest step is always served)."""
        return self.get(_STEP_SUFFIX.sub("", model_field))

    async def close(self) -> None:
        for served in self.models.values():
            await served.engine.close()
            served.store.close()

    # --- checkpoints ----------------------------------------------------------------------

    def list_checkpoints(self, name: str) -> list[CheckpointInfo]:
        from art_agents.server.checkpoints import list_checkpoints

        return list_checkpoints(self.get(name).model_dir)

    async def delete_checkpoints(self, name: str, steps: list[int] | None) -> list[int]:
        from art_agents.server.checkpoints import delete_checkpoints

        served = self.get(name)
        async with served.lock:
            return delete_checkpoints(served.model_dir, steps)

    # --- chat completions -----------------------------------------------------------------

    def _plan(self, body: dict[str, Any]) -> _ChatPlan:
        """Validate a chat request and render its prompt; refusals are `ServiceError`s."""
        served = self.resolve(body["model"])
        tools = body.get("tools") if body.get("tool_choice") != "none" else None
        try:
            prompt_ids = render_prompt_ids(served.engine.tokenizer, body["messages"], tools)
        except Exception as exc:  # jinja errors: a message shape the chat template rejects
            raise ServiceError(400, f"the chat template could not render these messages: {exc}") from exc
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
        limit = getattr(served.engine.model.config, "max_position_embeddings", None)
        if limit is not None and len(prompt_ids) + params.max_tokens > limit:
            raise ServiceError(
                400,
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's context "
                f"of {limit} tokens; shorten the conversation or lower max_tokens",
            )
        return _ChatPlan(served, prompt_ids, params, tools, f"chatcmpl-{uuid.uuid4().hex}")

    async def chat(self, body: dict[str, Any], rollout_id: str | None) -> dict[str, Any]:
        """Generate, record every choice in the token store, and build the OpenAI response."""
        response, _ = await self._complete(self._plan(body), rollout_id, None)
        return response

    async def chat_stream(self, body: dict[str, Any], rollout_id: str | None) -> AsyncIterator[StreamItem]:
        """Text deltas `(choice, text)` as tokens are sampled, then the recorded `(response, samples)`.

        Refusals raise before the first item. Content is streamed as it is generated, minus any tail
        that could still turn into a stop string; with tools, the message is sent once it can be
        parsed. The completion is generated and recorded by a task of its own, so a client that
        hangs up mid-stream still leaves a complete token record behind its completion id.
        """
        plan = self._plan(body)
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()

        def on_token(choice: int, token: int) -> None:
            loop.call_soon_threadsafe(tokens.put_nowait, (choice, token))

        task = asyncio.create_task(self._complete(plan, rollout_id, None if plan.tools else on_token))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda _: tokens.put_nowait(None))
        if not plan.tools:
            decoders = [_IncrementalText(plan.served.engine.tokenizer, plan.params.stop) for _ in range(plan.params.n)]
            while (item := await tokens.get()) is not None:
                choice, token = item
                if text := decoders[choice].push(token):
                    served_as = f"{plan.served.info.name}@{plan.served.step}"  # the step is fixed while a batch runs
                    yield StreamDelta(choice, text, plan.completion_id, served_as)
        yield await task

    async def _complete(
        self, plan: _ChatPlan, rollout_id: str | None, on_token: Any
    ) -> tuple[dict[str, Any], list[Sample]]:
        served, tokenizer = plan.served, plan.served.engine.tokenizer
        samples = await served.engine.generate(plan.prompt_ids, plan.params, on_token)
        ids = [plan.completion_id if i == 0 else f"{plan.completion_id}-{i}" for i in range(len(samples))]
        records = [
            TokenRecord(
                completion_id=cid,
                model=served.info.name,
                policy_step=s.step,
                prompt_ids=plan.prompt_ids,
                completion_ids=s.token_ids,
                logprobs=s.logprobs,
            )
            for cid, s in zip(ids, samples, strict=True)
        ]
        await asyncio.to_thread(served.store.add_many, records)  # on disk before the id is complete anywhere
        if rollout_id:
            self.rollouts[rollout_id] += 1
        choices = []
        for index, (cid, sample) in enumerate(zip(ids, samples, strict=True)):
            if plan.tools:
                message = parse_assistant(tokenizer, sample.text)
            else:
                message = {"role": "assistant", "content": sample.text}
            tool_finish = message.get("tool_calls") and sample.finish_reason == "stop"
            logprobs = [
                _token_logprob(tokenizer, t, lp) for t, lp in zip(sample.token_ids, sample.logprobs, strict=True)
            ]
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "finish_reason": "tool_calls" if tool_finish else sample.finish_reason,
                    "logprobs": {"content": logprobs},
                    "completion_id": cid,
                    "token_ids": sample.token_ids,
                }
            )
        completion_tokens = sum(len(s.token_ids) for s in samples)
        response = {
            "id": plan.completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": f"{served.info.name}@{samples[0].step}",
            "choices": choices,
            "usage": {
                "prompt_tokens": len(plan.prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(plan.prompt_ids) + completion_tokens,
            },
        }
        return response, samples

    # --- training -------------------------------------------------------------------------

    async def train(self, name: str, request: TrainRequest) -> AsyncIterator[TrainEvent]:
        """Run one train call; yields progress events and then a result (or error) event.

        Input errors raised before training starts surface as `ServiceError(400)` from the first
        `__anext__`, so the HTTP layer can still answer a 4xx instead of a 200 stream.
        """
        served = self.get(name)
        _check_request(request)
        events: asyncio.Queue[TrainEvent | BaseException | None] = asyncio.Queue()
        task = asyncio.create_task(self._train(served, request, events), name=f"train-{name}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        started = False
        try:
            while True:
                item = await events.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    if started:
                        yield TrainEvent(type="error", error=f"{type(item).__name__}: {item}")
                        return
                    raise item
                started = True
                yield item
        finally:
            if not task.done():
                log.info("train stream of %s closed early; the step still completes and is saved", name)

    async def _train(self, served: ServedModel, request: TrainRequest, events: asyncio.Queue) -> None:
        from art_agents.server.checkpoints import load_optimizer_state
        from art_agents.server.sequences import TrainingInputError
        from art_agents.server.trainer import PolicyTrainer

        loop = asyncio.get_running_loop()

        def progress(done: int, total: int, metrics: dict[str, float]) -> None:
            event = TrainEvent(type="progress", done=done, total=total, metrics=metrics)
            loop.call_soon_threadsafe(events.put_nowait, event)

        try:
            async with served.lock, served.engine.paused():
                step = served.step
                optimizer_state = await asyncio.to_thread(load_optimizer_state, served.model_dir, step)
                trainer = PolicyTrainer(served.engine.model, served.engine.tokenizer, served.store, optimizer_state)
                try:
                    metrics = await asyncio.to_thread(trainer.train, request.groups, request.config, progress)
                finally:
                    served.engine.model.eval()
                if not metrics.get("skipped"):
                    step = await asyncio.to_thread(self._commit, served, step + 1, trainer, metrics, request)
                    served.engine.step = step
                metrics = {**metrics, "step": float(step)}
            log.info("%s trained: step %d %s", served.info.name, step, json.dumps(metrics))
            result = TrainResult(step=step, metrics=metrics, config=request.config)
            events.put_nowait(TrainEvent(type="result", result=result))
        except TrainingInputError as exc:
            events.put_nowait(ServiceError(400, str(exc)))
        except Exception as exc:
            log.exception("training %s failed; step %d keeps serving", served.info.name, served.step)
            events.put_nowait(exc)
        finally:
            events.put_nowait(None)

    def _commit(
        self, served: ServedModel, step: int, trainer: Any, metrics: dict[str, float], request: TrainRequest
    ) -> int:
        from art_agents.server.checkpoints import append_history, save_checkpoint

        config = request.config.model_dump(mode="json")
        save_checkpoint(
            served.model_dir,
            step,
            served.engine.model,
            trainer.optimizer_state(),
            {"metrics": metrics, "config": config},
        )
        write_groups(served.model_dir / "trajectories" / "train" / f"{step:04d}.jsonl", request.groups)
        append_history(served.model_dir, {"step": step, "time": time.time(), "metrics": metrics, "config": config})
        return step


def _check_request(request: TrainRequest) -> None:
    if not request.groups:
        raise ServiceError(400, "groups is empty; pass at least one trajectory group to train on")
    for index, group in enumerate(request.groups):
        try:
            group.validate_for_training()
        except ValueError as exc:
            raise ServiceError(400, f"groups[{index}]: {exc}") from exc


def _token_logprob(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8")), "top_logprobs": []}

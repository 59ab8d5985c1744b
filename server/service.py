"""The server's state and operations, independent of HTTP: the facade `create_app` calls.

`ArtService` holds every registered model (`ServedModel`) and delegates the work: opening a model
(serving/served_model.py), chat completions (serving/completions.py) and train calls (serving/train_steps.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from art_agents.jsonl import read_history
from art_agents.server.engines.protocol import OlderStep
from art_agents.server.errors import ServiceError
from art_agents.server.models.model_sources import ModelSources
from art_agents.server.serving.checkpoint_fork import fork_checkpoint
from art_agents.server.serving.completions import (
    ChatPlan,
    Completed,
    Protocol,
    StreamItem,
    complete,
    plan_chat,
    stream_completion,
)
from art_agents.server.serving.rollout_log import RolloutLog
from art_agents.server.serving.served_model import ServedModel, check_name, open_served_model
from art_agents.server.serving.train_steps import record_log, sft_events, train_events
from art_agents.server.storage import checkpoints
from art_agents.wire import (
    DEFAULT_BEST_METRIC,
    CheckpointInfo,
    DeleteCheckpointsRequest,
    ForkRequest,
    ForkResult,
    LogRequest,
    LogResult,
    ModelInfo,
    RegisterRequest,
    TrainEvent,
    TrainRequest,
    TrainSFTRequest,
    policy_step_of,
    without_step,
)

log = logging.getLogger("art_agents.server")

T = TypeVar("T")


class ArtService:
    """Every model under `art_path`, reopened at startup from their model.json files."""

    def __init__(
        self, art_path: str | Path, *, test_engines: bool = False, sources: ModelSources | None = None
    ) -> None:
        self.art_path = Path(art_path).resolve()
        self.test_engines = test_engines
        self.sources = sources or ModelSources()
        self.models: dict[str, ServedModel] = {}
        self.rollouts = RolloutLog()
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
            except ServiceError as exc:  # a refusal says why in one line (another server owns the folder, say)
                log.warning("the model in %s is not served: %s", path.parent, exc.detail)
            except Exception:  # one broken model must not keep the others from being served
                log.exception("could not reopen the model in %s; it is not served", path.parent)

    async def register(self, request: RegisterRequest) -> ModelInfo:
        check_name(request.name)
        check_name(request.project, "project")
        if request.config.engine == "scripted" and not self.test_engines:
            raise ServiceError(400, "engine 'scripted' is for the test suite only; use engine='transformers'")
        self.sources.check(request.base_model)
        async with self._register_lock:
            served = self.models.get(request.name)
            if served is not None:
                if served.info.project != request.project:
                    raise ServiceError(
                        409,
                        f"model {request.name!r} already exists in project {served.info.project!r}; pick another name",
                    )
                return served.info.model_copy(update={"step": served.step})
            model_dir = self.model_dir(request.project, request.name)
            served = await asyncio.to_thread(open_served_model, model_dir, request)
            self.models[request.name] = served
            return served.info

    def get(self, name: str) -> ServedModel:
        check_name(name)
        served = self.models.get(name)
        if served is None:
            known = ", ".join(sorted(self.models)) or "none"
            raise ServiceError(
                404,
                f"model {name!r} is not registered on this server (registered: {known}); register it with "
                f"`await TrainableModel(name={name!r}, base_model=...).register(backend)`, or start the server with "
                f"`art-agents serve --model {name} --base-model PATH_OR_HUB_ID`",
            )
        return served

    def resolve(self, model_field: str) -> tuple[ServedModel, OlderStep | None]:
        """A chat request's `model`: `name` (the latest step) or `name@step` (that checkpoint, if it exists)."""
        served = self.get(without_step(model_field))
        step = policy_step_of(model_field)
        if step is None or step == served.step:
            return served, None
        if step > served.step:
            raise ServiceError(
                404,
                f"model {served.info.name!r} has no step {step}: its latest is {served.step} (`{served.served_as}`)",
            )
        path = checkpoints.checkpoint_path(served.model_dir, step)
        if not path.is_dir():
            raise ServiceError(
                404,
                f"checkpoint {step} of model {served.info.name!r} was deleted; "
                f"steps kept: {[c.step for c in checkpoints.list_checkpoints(served.model_dir)]}",
            )
        return served, OlderStep(step, path)

    async def close(self) -> None:
        for served in self.models.values():
            await served.close()

    # --- checkpoints ----------------------------------------------------------------------

    def list_checkpoints(self, name: str) -> list[CheckpointInfo]:
        return checkpoints.list_checkpoints(self.get(name).model_dir)

    async def delete_checkpoints(self, name: str, request: DeleteCheckpointsRequest) -> list[int]:
        """Delete the steps asked for; see `DeleteCheckpointsRequest` for what each form keeps."""
        served = self.get(name)
        if request.steps is not None and request.best_checkpoint_metric is not None:
            raise ServiceError(400, "give steps or best_checkpoint_metric, not both")
        async with served.lock, served.engine.paused():
            served.engine.forget_older()  # a deleted checkpoint must not go on being served from memory
            if request.steps is not None:
                deleted = checkpoints.delete_checkpoints(served.model_dir, request.steps)
            else:
                deleted = checkpoints.delete_all_but(
                    served.model_dir, self._kept(served, request.best_checkpoint_metric)
                )
            served.store.delete_steps(deleted)  # tokens sampled by a policy that is gone
            return deleted

    async def fork(self, name: str, request: ForkRequest) -> ForkResult:
        """Serve another model's checkpoint as this model's (see serving/checkpoint_fork.py)."""
        served = self.get(name)
        source = self.model_dir(
            check_name(request.from_project or served.info.project, "from_project"),
            check_name(request.from_model, "from_model"),
        )
        async with served.lock, served.engine.paused():
            return await asyncio.to_thread(fork_checkpoint, served, request, source)

    def _kept(self, served: ServedModel, metric: str | None) -> set[int]:
        """The steps a delete without `steps` keeps: latest and best by `metric`, or latest, 0 and any best val step."""
        existing = [c.step for c in checkpoints.list_checkpoints(served.model_dir)]
        rows = read_history(served.model_dir)
        if metric is None:
            best = checkpoints.best_step(rows, DEFAULT_BEST_METRIC, existing)
            return {0, served.step} | ({best} if best is not None else set())
        best = checkpoints.best_step(rows, metric, existing)
        if best is None:
            recorded = checkpoints.metric_names(rows)
            split = metric.split("/")[0] if "/" in metric else "val"
            raise ServiceError(
                400,
                f"no checkpoint of model {served.info.name!r} has a {metric!r} value in history.jsonl, so nothing "
                f"was deleted; record one with `await model.log(groups, split={split!r})` before deleting (it writes "
                f"'{split}/reward' and '{split}/<metric>' for each trajectory metric), or pass the steps to delete; "
                f"metrics recorded: {', '.join(recorded) or 'none'}",
            )
        return {served.step, best}

    # --- evaluation logs ------------------------------------------------------------------

    async def log(self, name: str, request: LogRequest) -> LogResult:
        """Record evaluation groups at the served step (or `request.step`) without training."""
        return await asyncio.to_thread(record_log, self.get(name), request)

    # --- chat completions and training ----------------------------------------------------

    async def plan_chat(
        self, body: dict[str, Any], rollout_id: str | None, *, protocol: Protocol = "chat", record: bool = False
    ) -> ChatPlan:
        """A chat request (any protocol's, in chat form) checked and rendered; refusals raise `ServiceError`.

        `record`: keep the call itself for the rollout's assembly (see serving/rollout_log.py), not only its count.
        """
        served, older = self.resolve(body["model"])
        plan = await asyncio.to_thread(plan_chat, served, body, rollout_id, older)
        plan.protocol = protocol
        if record and rollout_id:
            self.rollouts.start_keeping(rollout_id)
        return plan

    async def run(self, plan: ChatPlan, cancel: threading.Event | None = None) -> Completed:
        """Generate, record every choice in the token store, and build the OpenAI chat response.

        Setting `cancel` (the client went away) ends the generation at the next token.
        """
        if cancel is not None:
            plan.cancel = cancel
        return await complete(plan, self.rollouts)

    def run_stream(self, plan: ChatPlan) -> AsyncIterator[StreamItem]:
        """`StreamDelta`s as tokens are sampled, then the recorded `(response, samples)`."""
        return stream_completion(plan, self.rollouts, self._spawn)

    async def chat(
        self, body: dict[str, Any], rollout_id: str | None, cancel: threading.Event | None = None, record: bool = False
    ) -> dict[str, Any]:
        """An OpenAI chat completion for `body`."""
        response, _ = await self.run(await self.plan_chat(body, rollout_id, record=record), cancel)
        return response

    async def chat_stream(
        self, body: dict[str, Any], rollout_id: str | None, record: bool = False
    ) -> AsyncIterator[StreamItem]:
        """As `run_stream`; refusals raise before the first item."""
        plan = await self.plan_chat(body, rollout_id, record=record)
        async for item in self.run_stream(plan):
            yield item

    def train(self, name: str, request: TrainRequest) -> AsyncGenerator[TrainEvent, None]:
        """Progress events, then a result or error event; input errors raise `ServiceError(400)` first."""
        return train_events(self.get(name), request, self._spawn)

    def train_sft(self, name: str, request: TrainSFTRequest) -> AsyncGenerator[TrainEvent, None]:
        """As `train`, for one supervised fine-tuning call on demonstrations."""
        return sft_events(self.get(name), request, self._spawn)

    def _spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run `work` as a task that is kept alive even when the response stream that started it closes."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

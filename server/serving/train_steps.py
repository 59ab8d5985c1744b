"""One train call of a served model (an RL step or an SFT call): train the policy, commit checkpoint N+1,
publish it to the engine, serve it. Both kinds share the lock, the commit and the rollback, so RL and SFT
steps form one lineage; the history row's `kind` ("rl" or "sft") tells them apart.

The trainer trains the model's own policy (training/policy_model.py) while the engine serves step N beside it
(or sleeps, if it shares the trainer's GPU: `Engine.beside_training`). Checkpoint N+1 is the commit: the engine
is paused briefly while it is written from the policy, loaded by the engine and recorded in the history; only
then is N+1 served. If any of that fails, the policy and the engine are set back to checkpoint N, so the served
step and the served weights always agree (the optimizer state needs no undo: each call loads it from the
checkpoint it starts from).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from art_agents.jsonl import write_groups
from art_agents.names import check_safe_name
from art_agents.server.errors import ServiceError, describe
from art_agents.server.host.memory import trim_heap
from art_agents.server.models.lora_model import device_of
from art_agents.server.models.serving_precision import mismatch_corrected
from art_agents.server.serving.served_model import ServedModel
from art_agents.server.storage import checkpoints
from art_agents.server.training.sequences import check_unique_completions
from art_agents.server.training.step_work import StepWork
from art_agents.trajectory import TrajectoryGroup, validate_groups
from art_agents.wire import (
    LogRequest,
    LogResult,
    TrainEvent,
    TrainRequest,
    TrainResult,
    TrainSFTEvent,
    TrainSFTRequest,
    TrainSFTResult,
    split_metrics,
)

if TYPE_CHECKING:
    from art_agents.sft_config import TrainSFTConfig
    from art_agents.train_config import TrainConfig

log = logging.getLogger("art_agents.server")

Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


class CheckpointNotSaved(RuntimeError):
    """Training finished but its checkpoint could not be committed; the previous step serves on."""


def check_train_request(request: TrainRequest) -> None:
    """Refuse empty, malformed or repeated groups up front, as a 400 naming the group or the completion id."""
    if not request.groups:
        raise ServiceError(400, "groups is empty; pass at least one trajectory group to train on")
    try:
        validate_groups(request.groups)
        check_unique_completions(request.groups)
    except ValueError as exc:
        raise ServiceError(400, str(exc)) from exc


def check_sft_request(request: TrainSFTRequest) -> None:
    """Refuse an empty call or a learning-rate schedule of the wrong length up front, as a 400 saying the fix."""
    if not request.trajectories:
        raise ServiceError(400, "trajectories is empty; pass at least one trajectory with an assistant reply")
    try:
        request.config.learning_rates(len(request.config.batches(len(request.trajectories))))
    except ValueError as exc:
        raise ServiceError(400, str(exc)) from exc


@dataclass(frozen=True)
class _Step:
    """What differs between an RL step and an SFT call; everything else in `_train` is shared."""

    kind: Literal["rl", "sft"]  # the history row's "kind"
    groups: list[TrajectoryGroup]  # written as trajectories/train/<step>.jsonl
    config: TrainConfig | TrainSFTConfig
    max_staleness: int | None  # None: a stored turn of any age (imitation has no importance ratio)
    truncate: bool
    event: type[TrainEvent]
    result: Callable[[int, dict[str, float]], Any]
    caller_metrics: dict[str, float]  # the client's figures for the history row


def train_events(served: ServedModel, request: TrainRequest, spawn: Spawn) -> AsyncGenerator[TrainEvent, None]:
    """One GRPO step's progress events and then its result (or error) event (see `_step_events`); a refused request
    raises ServiceError(400) here."""
    check_train_request(request)
    config = mismatch_corrected(request.config, served.info.config, device_of(served.info.config))
    step = _Step(
        "rl",
        request.groups,
        config,
        config.max_staleness,
        config.truncate_to_context,
        TrainEvent,
        lambda n, metrics: TrainResult(step=n, skipped=bool(metrics.get("skipped")), metrics=metrics, config=config),
        request.metrics,
    )
    return _step_events(served, step, spawn)


def sft_events(served: ServedModel, request: TrainSFTRequest, spawn: Spawn) -> AsyncGenerator[TrainEvent, None]:
    """One SFT call on the request's demonstrations: the same events as `train_events`."""
    check_sft_request(request)
    config = request.config
    step = _Step(
        "sft",
        [TrajectoryGroup(request.trajectories)],
        config,
        None,
        config.truncate_to_context,
        TrainSFTEvent,
        lambda n, metrics: TrainSFTResult(step=n, metrics=metrics, config=config),
        {},
    )
    return _step_events(served, step, spawn)


async def _step_events(served: ServedModel, step: _Step, spawn: Spawn) -> AsyncGenerator[TrainEvent, None]:
    """Progress events and then a result (or error) event of one step.

    Input errors raised before training starts surface as `ServiceError(400)` from the first
    `__anext__`, so the HTTP layer can still answer a 4xx instead of a 200 stream; any other failure is an
    error event, named, whenever it happens. The step runs in
    a task of its own (`spawn`), so it completes and is saved even if the client hangs up.
    """
    events: asyncio.Queue[TrainEvent | BaseException | None] = asyncio.Queue()
    task = spawn(_train(served, step, events))
    started = False
    try:
        while (item := await events.get()) is not None:
            if isinstance(item, BaseException):
                if started or not isinstance(item, ServiceError):  # a failed step, not a refused request
                    yield step.event(type="error", error=describe(item))
                    return
                raise item
            started = True
            yield item
    finally:
        if not task.done():
            log.info("train stream of %s closed early; the step still completes and is saved", served.info.name)


def _named_checkpoints(served: ServedModel, config: TrainConfig, step: int) -> dict[int, str]:
    """The adapter folders of the steps `config` scores with (a KL reference, a teacher); a step not saved is a 400."""
    from art_agents.server.training.sequences import TrainingInputError

    found = {n: checkpoints.checkpoint_path(served.model_dir, n) for n in sorted(config.named_steps())}
    missing = [n for n, path in found.items() if n > step or not path.is_dir()]
    if missing:
        raise TrainingInputError(
            f"step {missing[0]} (reference_step or teacher) has no checkpoint: {served.info.name} is at step {step}; "
            f"name a saved step (GET /v1/art/models/{served.info.name}/checkpoints lists them)"
        )
    return {n: str(path) for n, path in found.items()}


async def _train(served: ServedModel, spec: _Step, events: asyncio.Queue) -> None:
    from art_agents.server.training.sequences import Policy, TrainingInputError

    loop = asyncio.get_running_loop()

    def progress(done: int, total: int, metrics: dict[str, float]) -> None:
        event = spec.event(type="progress", done=done, total=total, metrics=metrics)
        loop.call_soon_threadsafe(events.put_nowait, event)

    try:
        async with served.lock:
            started = time.perf_counter()
            step = served.step
            optimizer_state = await asyncio.to_thread(checkpoints.load_optimizer_state, served.model_dir, step)
            trainer = served.trainer(optimizer_state)
            try:
                policy = Policy(
                    served.info.name,
                    step,
                    step if spec.max_staleness is None else spec.max_staleness,
                    served.context_tokens,
                    served.engine.longest_token_bytes,
                    spec.truncate,
                )
                named = _named_checkpoints(served, spec.config, step) if spec.kind == "rl" else {}
                work = StepWork(spec.kind, spec.config, policy, spec.groups, named)  # type: ignore[arg-type]
                async with served.engine.beside_training():
                    metrics = await asyncio.to_thread(trainer.run, work, progress)
            finally:
                served.policy.model.eval()
                trim_heap()
            # the rollouts' prefill since the previous step; the caller's figures never shadow the trainer's
            metrics = {**spec.caller_metrics, **metrics, **served.engine.prefill_tokens.take_metrics()}
            if not metrics.get("skipped"):
                async with served.engine.paused():
                    await asyncio.to_thread(_check_servable, served, step, spec.config.learning_rate)
                    await asyncio.to_thread(
                        _commit, served, step + 1, trainer.optimizer_state(), metrics, spec, started
                    )
                    step = served.engine.step = step + 1
            metrics = {**metrics, "step": float(step)}
        log.info("%s trained (%s): step %d %s", served.info.name, spec.kind, step, json.dumps(metrics))
        events.put_nowait(spec.event(type="result", result=spec.result(step, metrics)))
    except TrainingInputError as exc:
        events.put_nowait(ServiceError(400, str(exc)))
    except Exception as exc:
        log.exception("training %s failed; step %d keeps serving", served.info.name, served.step)
        events.put_nowait(exc)
    finally:
        events.put_nowait(None)


def _commit(
    served: ServedModel,
    step: int,
    optimizer_state: dict,
    metrics: dict[str, float],
    spec: _Step,
    started: float,
) -> None:
    """Write checkpoint `step`, its trajectories and its history row; on failure undo all and reload step-1.

    `metrics` gains `step_s`: the step's wall time from taking the model to its checkpoint on disk.
    """
    config = spec.config.model_dump(mode="json")
    groups_path = trajectories_path(served.model_dir, "train", step)
    try:
        checkpoints.refuse_existing(checkpoints.checkpoint_path(served.model_dir, step))  # before writing any of it
        write_groups(groups_path, spec.groups)
        path = checkpoints.save_checkpoint(
            served.model_dir, step, served.policy.model, optimizer_state, {"metrics": metrics, "config": config}
        )
        served.engine.publish_checkpoint(step, path)
        metrics["step_s"] = time.perf_counter() - started
        checkpoints.append_history(
            served.model_dir,
            {"step": step, "kind": spec.kind, "time": time.time(), "metrics": metrics, "config": config},
        )
    except Exception as exc:
        failure = f"saving checkpoint {step} failed ({type(exc).__name__}: {exc})"
        _roll_back(served, step, None if isinstance(exc, checkpoints.CheckpointExists) else groups_path, failure)
        raise CheckpointNotSaved(
            f"{failure}; the trained weights were dropped and the last good checkpoint {step - 1} keeps serving"
        ) from exc


def _check_servable(served: ServedModel, step: int, learning_rate: float | list[float]) -> None:
    """Refuse trained weights that cannot serve before they are committed; if they are refused (or the check itself
    fails), the policy gets step's weights back, so the next step trains from what is served."""
    from art_agents.server.training.servable import UnservableWeights, check_servable

    try:
        check_servable(served.policy.model, served.policy.tokenizer, learning_rate)
    except Exception as exc:
        served.policy.load_checkpoint(checkpoints.checkpoint_path(served.model_dir, step))
        if isinstance(exc, UnservableWeights):
            raise UnservableWeights(f"step {step + 1} was not committed: {exc}; step {step} keeps serving") from None
        raise


def trajectories_path(model_dir: Path, split: str, step: int) -> Path:
    return model_dir / "trajectories" / split / f"{step:04d}.jsonl"


def record_log(served: ServedModel, request: LogRequest) -> LogResult:
    """Record evaluation groups without training: `trajectories/<split>/<step>.jsonl` and a history row.

    The row is `{"step", "split", "time", "metrics"}` with the metrics named `<split>/...` (see `split_metrics`), so
    `delete_checkpoints(best_checkpoint_metric="val/reward")` can pick the best step. A second log of the same
    split at the same step replaces the file and adds a row (rows of one step are averaged when picking).
    """
    try:
        split = check_safe_name(request.split, "split")
    except ValueError as exc:
        raise ServiceError(400, str(exc)) from exc
    if not request.groups and not request.metrics:
        raise ServiceError(400, "nothing to log: pass trajectory groups, metrics, or both")
    step = served.step if request.step is None else request.step
    metrics = split_metrics(request.groups, split, request.metrics)
    path = None
    if request.groups:
        path = write_groups(trajectories_path(served.model_dir, split, step), request.groups)
    checkpoints.append_history(
        served.model_dir, {"step": step, "split": split, "time": time.time(), "metrics": metrics}
    )
    return LogResult(step=step, split=split, metrics=metrics, path=str(path) if path else None)


def _roll_back(served: ServedModel, step: int, groups_path: Path | None, failure: str) -> None:
    """Put checkpoint step-1's adapter weights back in the policy and the engine and remove what was written for
    `step` (`groups_path` None: nothing was, and the step's files on disk belong to another writer)."""
    good = step - 1
    try:
        served.policy.load_checkpoint(checkpoints.checkpoint_path(served.model_dir, good))
        served.engine.load_adapter(checkpoints.checkpoint_path(served.model_dir, good))
        if groups_path is not None:
            checkpoints.discard_checkpoint(served.model_dir, step)
            groups_path.unlink(missing_ok=True)
    except Exception as undo:
        raise CheckpointNotSaved(
            f"{failure}, and restoring checkpoint {good} failed too ({type(undo).__name__}: {undo}); the served "
            f"weights may not match step {good}: restart the server to reload its latest checkpoint"
        ) from undo

"""`RemoteBackend`: an `art-agents serve` reached over HTTP, anywhere (`LocalBackend` starts one and extends this)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from art_agents.art.arguments import art_train_config
from art_agents.errors import ArtError, ServerError
from art_agents.progress import progress_bar
from art_agents.report import reporters
from art_agents.report.reporters import ReportedModel, Reporter, StepRecord
from art_agents.sft_config import TrainSFTConfig
from art_agents.train_config import TrainConfig
from art_agents.trajectory import Trajectory, TrajectoryGroup, validate_groups
from art_agents.wire import (
    API_PREFIX,
    CheckpointInfo,
    DeleteCheckpointsRequest,
    ForkRequest,
    ForkResult,
    LogRequest,
    LogResult,
    ModelInfo,
    RegisterRequest,
    StepInfo,
    TrainEvent,
    TrainRequest,
    TrainResult,
    TrainSFTEvent,
    TrainSFTRequest,
    TrainSFTResult,
)

if TYPE_CHECKING:
    import httpx


class RegisteredModel(ReportedModel, Protocol):
    """What a backend reads from a TrainableModel: what the server registers, and the reporters of its steps.

    A TrainableModel satisfies it; a Protocol keeps the backends below `art_agents.model`, which uses them.
    """

    @property
    def reporters(self) -> list[Reporter]: ...


class RemoteBackend:
    """An art-agents server reached over HTTP (`api_key` is sent as a Bearer token)."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 600.0) -> None:
        import httpx  # lazy: httpx pulls in rich and click at import, too slow for `import art_agents`

        from art_agents.backends.server_capture import remember_server

        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout)
        self._models: dict[str, RegisteredModel] = {}  # registered here: their reporters flush at close()
        remember_server(self.base_url, api_key)  # any client's calls to it inside a rollout are captured

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = await self._http.request(method, API_PREFIX + path, **kwargs)
        except httpx.TransportError as exc:
            raise ArtError(f"cannot reach the art-agents server at {self.base_url}: {exc}; is it running?") from exc
        _raise_for_status(response)
        return response.json()

    async def register(self, model: RegisteredModel) -> ModelInfo:
        body = RegisterRequest(
            name=model.name, project=model.project, base_model=model.base_model, config=model.server_config
        )
        info = ModelInfo.model_validate(await self._request("POST", "/models", json=body.model_dump(mode="json")))
        self._models[model.name] = model
        return info

    async def get_step(self, model: RegisteredModel) -> int:
        return StepInfo.model_validate(await self._request("GET", f"/models/{model.name}/step")).step

    def train_events(
        self,
        model: RegisteredModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        metrics: Mapping[str, float] | None = None,
    ) -> AsyncGenerator[TrainEvent, None]:
        """The step's events as the server sends them; `aclose()` (or `contextlib.aclosing`) ends the response
        where a caller stops reading early."""
        body = TrainRequest(groups=groups, config=config, metrics=dict(metrics or {})).model_dump_json()
        return self._stream(f"/models/{model.name}/train", body, TrainEvent)

    async def _stream(self, path: str, body: str, event: type[TrainEvent]) -> AsyncGenerator[Any, None]:
        """The NDJSON events of a train route; a 4xx/5xx before the stream raises ServerError."""
        import httpx

        try:
            async with self._http.stream(
                "POST", API_PREFIX + path, content=body, headers={"content-type": "application/json"}
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for_status(response)
                async for line in response.aiter_lines():
                    if line.strip():
                        yield event.model_validate_json(line)
        except httpx.TransportError as exc:
            raise ArtError(
                f"the connection to {self.base_url} broke during training ({exc}); the server keeps serving its "
                "last good checkpoint, and the same train call can be retried once it is back"
            ) from exc

    async def train(
        self,
        model: RegisteredModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        progress: bool = True,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
        metrics: Mapping[str, float] | None = None,
        **options: Any,
    ) -> TrainResult:
        """One GRPO step on the groups; returns when the new checkpoint is being served.

        ART's `_config` dict and its `backend.train` keywords (`learning_rate=`, `epsilon=`, ...) are applied
        to `config` by `art_train_config`, which refuses by name what this trainer cannot do. `verbose`
        prints a line when the step starts and when it ends.
        """
        config = art_train_config(config, _config, **options)
        groups = list(groups)
        validate_groups(groups)
        if verbose:
            print(
                f"training {model.name} on {len(groups)} groups ({sum(len(g.trajectories) for g in groups)} rollouts)"
            )
        started_at = time.time()
        result = await _result_of(self.train_events(model, groups, config, metrics), f"train {model.name}", progress)
        reporters.send(
            model.reporters, StepRecord("train", result.step, groups, result.metrics, started_at, time.time())
        )
        if verbose and result.skipped:
            print(f"{model.name} trained nothing (no group had a reward spread); step {result.step} still serves")
        elif verbose:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in result.metrics.items() if k in ("reward_mean", "loss"))
            print(f"{model.name} now serves step {result.step}" + (f" ({shown})" if shown else ""))
        return result

    async def train_sft(
        self,
        model: RegisteredModel,
        trajectories: list[Trajectory],
        config: TrainSFTConfig | None = None,
        *,
        progress: bool = True,
        verbose: bool = False,
    ) -> TrainSFTResult:
        """One supervised fine-tuning call on the trajectories' assistant replies; returns once step N+1 serves."""
        request = TrainSFTRequest(trajectories=trajectories, config=config or TrainSFTConfig())
        if verbose:
            print(f"fine-tuning {model.name} on {len(trajectories)} trajectories")
        started_at = time.time()
        events = self._stream(f"/models/{model.name}/train_sft", request.model_dump_json(), TrainSFTEvent)
        result = await _result_of(events, f"train_sft {model.name}", progress)
        groups = [TrajectoryGroup(trajectories)]
        reporters.send(
            model.reporters, StepRecord("train", result.step, groups, result.metrics, started_at, time.time())
        )
        if verbose:
            print(f"{model.name} now serves step {result.step} (sft loss={result.metrics.get('loss', 0.0):.4g})")
        return result

    async def log(
        self,
        model: RegisteredModel,
        groups: list[TrajectoryGroup],
        split: str = "val",
        *,
        metrics: dict[str, float] | None = None,
        step: int | None = None,
    ) -> LogResult:
        """Record evaluation groups for `split` at the served step (or `step`) without training."""
        started_at = time.time()
        body = LogRequest(split=split, groups=groups, metrics=metrics or {}, step=step).model_dump_json()
        headers = {"content-type": "application/json"}
        data = await self._request("POST", f"/models/{model.name}/log", content=body, headers=headers)
        result = LogResult.model_validate(data)
        record = StepRecord(result.split, result.step, groups, result.metrics, started_at, time.time())
        reporters.send(model.reporters, record)
        return result

    async def list_checkpoints(self, model: RegisteredModel) -> list[CheckpointInfo]:
        rows = await self._request("GET", f"/models/{model.name}/checkpoints")
        return [CheckpointInfo.model_validate(row) for row in rows]

    async def fork_checkpoint(
        self,
        model: RegisteredModel,
        from_model: str,
        from_project: str | None = None,
        not_after_step: int | None = None,
    ) -> ForkResult:
        """Start `model` (registered, not trained past the copied step) from another model's checkpoint: its
        latest, or its latest at or before `not_after_step`. Both need the same base model and LoRA settings."""
        body = ForkRequest(from_model=from_model, from_project=from_project, not_after_step=not_after_step)
        return ForkResult.model_validate(
            await self._request("POST", f"/models/{model.name}/fork", json=body.model_dump(mode="json"))
        )

    async def _experimental_fork_checkpoint(
        self,
        model: RegisteredModel,
        from_model: str,
        from_project: str | None = None,
        from_s3_bucket: str | None = None,
        not_after_step: int | None = None,
        verbose: bool = False,
        prefix: str | None = None,
    ) -> None:
        """ART's name for `fork_checkpoint`; its S3 source is refused (copy the model folder here first)."""
        if from_s3_bucket is not None or prefix is not None:
            raise ArtError(
                "forking from S3 (from_s3_bucket, prefix) is not supported by art-agents: copy the source model's "
                "folder (<art_path>/<project>/models/<name>/) next to this one, then fork without them"
            )
        result = await self.fork_checkpoint(model, from_model, from_project, not_after_step)
        if verbose:
            print(f"{model.name} forked from {result.forked_from}")

    async def delete_checkpoints(
        self, model: RegisteredModel, steps: list[int] | None = None, *, best_checkpoint_metric: str | None = None
    ) -> list[int]:
        """Delete `steps`, or all but the latest and the best by `best_checkpoint_metric` (see the model's method)."""
        request = DeleteCheckpointsRequest(steps=steps, best_checkpoint_metric=best_checkpoint_metric)
        body = request.model_dump(mode="json")
        return list(await self._request("POST", f"/models/{model.name}/checkpoints/delete", json=body))

    async def close(self) -> None:
        for model in self._models.values():
            await asyncio.to_thread(reporters.close, model.reporters)
        await self._http.aclose()


async def _result_of(events: AsyncGenerator[Any, None], label: str, progress: bool) -> Any:
    """The result of a train route's event stream, with a progress bar; an error event raises ArtError.

    The stream is closed here, in the caller's task, however this ends (an error event, or the caller cancelling
    as `asyncio.wait_for` does), never left to the garbage collector's finalizer, which closes the response in a
    task of its own that nobody awaits."""
    result = None
    with progress_bar(label, unit="seq", show=progress) as bar:
        async with contextlib.aclosing(events):
            async for event in events:
                if event.type == "error":
                    raise ArtError(f"training failed on the server: {event.error}")
                if event.type == "progress":
                    bar.total = event.total
                    bar.n = event.done
                    bar.set_postfix({k: f"{v:.3g}" for k, v in event.metrics.items()}, refresh=True)
                if event.type == "result":
                    result = event.result
    if result is None:
        raise ArtError("the server closed the train stream without a result; retry the same call")
    return result


def _raise_for_status(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        detail = response.json().get("detail", response.text)
    except (json.JSONDecodeError, AttributeError):
        detail = response.text
    raise ServerError(response.status_code, detail if isinstance(detail, str) else json.dumps(detail))

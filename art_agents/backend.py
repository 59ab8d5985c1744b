"""Backends: where a TrainableModel is served and trained.

`RemoteBackend` talks to an `art-agents serve` anywhere; `LocalBackend` starts one as a child
process on this machine and talks to it the same way, so both keep one contract (and a crash of
the training process cannot take the user's rollout code down with it). `LocalBackend(in_process=True)`
runs the same server in a thread of this process instead, as ART's `in_process` does.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from art_agents import reporters
from art_agents.errors import ArtError, ServerError
from art_agents.progress import progress_bar
from art_agents.reporters import StepRecord
from art_agents.train_config import TrainConfig, TrainSFTConfig
from art_agents.trajectory import Trajectory, TrajectoryGroup, validate_groups
from art_agents.wire import (
    API_PREFIX,
    CheckpointInfo,
    DeleteCheckpointsRequest,
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

# Where every command keeps its server folder unless told otherwise, so `art-agents report` finds it.
DEFAULT_ART_PATH = Path(".art")

if TYPE_CHECKING:
    import httpx
    import uvicorn

    from art_agents.model import TrainableModel

# ART's training options (its `_config` dict, `art.dev.TrainConfig`, and the keywords of its `backend.train`) that
# this trainer has, by TrainConfig field.
ART_TRAIN_FIELDS = {
    "learning_rate": "learning_rate",
    "beta": "beta",
    "kl_penalty_coef": "beta",
    "epsilon": "epsilon",
    "epsilon_high": "epsilon_high",
    "scale_rewards": "scale_rewards",
    "truncated_importance_sampling": "tis_cap",
}
_ANY = object()
# ART options accepted at the values that match what this trainer does anyway, or (_ANY) that only tune speed or
# debugging output of ART's own trainer. Other values, and every option not listed, are refused by name.
ART_TRAIN_NEUTRAL: dict[str, Any] = {
    "allow_training_without_logprobs": _ANY,  # turns without stored tokens are re-tokenized and counted here
    "precalculate_logprobs": _ANY,
    "logprob_calculation_chunk_size": _ANY,
    "plot_tensors": (False,),
    "importance_sampling_level": ("token",),
    "advantage_balance": (0, 0.0),
    "scale_learning_rate_by_reward_std_dev": (False,),
    "num_trajectories_learning_rate_multiplier_power": (0, 0.0),
    "mask_prob_ratio": (False,),
    "kimi_k2_tau": (None,),
    "save_checkpoint": (True,),
}


def art_train_config(
    config: TrainConfig | None, dev_config: Mapping[str, Any] | None = None, **options: Any
) -> TrainConfig:
    """`config` with ART's training options applied (`_config`, or `backend.train` keywords; these win).

    Mapped: learning_rate, beta / kl_penalty_coef (KL penalty), epsilon, epsilon_high, scale_rewards,
    truncated_importance_sampling (tis_cap), and normalize_by_length=False (loss="dr_grpo"). Speed and
    debugging knobs of ART's trainer are accepted and ignored; anything else raises ArtError naming it.
    """
    given = {**(dev_config or {}), **options}
    updates: dict[str, Any] = {}
    refused: list[str] = []
    for key, value in given.items():
        neutral = ART_TRAIN_NEUTRAL.get(key)
        if key in ART_TRAIN_FIELDS:
            updates[ART_TRAIN_FIELDS[key]] = value
        elif key == "normalize_by_length" and isinstance(value, bool):
            if not value:
                updates["loss"] = "dr_grpo"
            elif (config or TrainConfig()).loss == "dr_grpo":
                refused.append("normalize_by_length=True with loss='dr_grpo'")
        elif neutral is _ANY or (neutral is not None and value in neutral):
            continue
        else:
            refused.append(f"{key}={value!r}")
    if refused:
        raise ArtError(
            f"training options not supported by art-agents: {', '.join(refused)}. Supported: "
            f"{', '.join(sorted(ART_TRAIN_FIELDS))}, normalize_by_length; the rest of TrainConfig (loss, "
            "num_iterations, max_staleness, ...) is set with art_agents.TrainConfig(...)"
        )
    base = config or TrainConfig()
    return TrainConfig.model_validate({**base.model_dump(), **updates}) if updates else base


@runtime_checkable
class Backend(Protocol):
    """What a TrainableModel needs from wherever it lives."""

    base_url: str
    api_key: str | None

    async def register(self, model: TrainableModel) -> ModelInfo: ...
    async def get_step(self, model: TrainableModel) -> int: ...
    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        progress: bool = True,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
    ) -> TrainResult: ...
    async def train_sft(
        self,
        model: TrainableModel,
        trajectories: list[Trajectory],
        config: TrainSFTConfig | None = None,
        *,
        progress: bool = True,
        verbose: bool = False,
    ) -> TrainSFTResult: ...
    async def log(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        split: str = "val",
        *,
        metrics: dict[str, float] | None = None,
        step: int | None = None,
    ) -> LogResult: ...
    async def list_checkpoints(self, model: TrainableModel) -> list[CheckpointInfo]: ...
    async def delete_checkpoints(
        self, model: TrainableModel, steps: list[int] | None = None, *, best_checkpoint_metric: str | None = None
    ) -> list[int]: ...
    async def close(self) -> None: ...


class RemoteBackend:
    """An art-agents server reached over HTTP (`api_key` is sent as a Bearer token)."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 600.0) -> None:
        import httpx  # lazy: httpx pulls in rich and click at import, too slow for `import art_agents`

        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout)
        self._models: dict[str, TrainableModel] = {}  # registered here: their reporters flush at close()

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = await self._http.request(method, API_PREFIX + path, **kwargs)
        except httpx.TransportError as exc:
            raise ArtError(f"cannot reach the art-agents server at {self.base_url}: {exc}; is it running?") from exc
        _raise_for_status(response)
        return response.json()

    async def register(self, model: TrainableModel) -> ModelInfo:
        body = RegisterRequest(
            name=model.name, project=model.project, base_model=model.base_model, config=model.server_config
        )
        info = ModelInfo.model_validate(await self._request("POST", "/models", json=body.model_dump(mode="json")))
        self._models[model.name] = model
        return info

    async def get_step(self, model: TrainableModel) -> int:
        return StepInfo.model_validate(await self._request("GET", f"/models/{model.name}/step")).step

    async def train_events(
        self, model: TrainableModel, groups: list[TrajectoryGroup], config: TrainConfig
    ) -> AsyncIterator[TrainEvent]:

        body = TrainRequest(groups=groups, config=config).model_dump_json()
        async for event in self._stream(f"/models/{model.name}/train", body, TrainEvent):
            yield event

    async def _stream(self, path: str, body: str, event: type[TrainEvent]) -> AsyncIterator[Any]:
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
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        progress: bool = True,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
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
        result = await _result_of(self.train_events(model, groups, config), f"train {model.name}", progress)
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
        model: TrainableModel,
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
        model: TrainableModel,
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

    async def list_checkpoints(self, model: TrainableModel) -> list[CheckpointInfo]:
        rows = await self._request("GET", f"/models/{model.name}/checkpoints")
        return [CheckpointInfo.model_validate(row) for row in rows]

    async def delete_checkpoints(
        self, model: TrainableModel, steps: list[int] | None = None, *, best_checkpoint_metric: str | None = None
    ) -> list[int]:
        """Delete `steps`, or all but the latest and the best by `best_checkpoint_metric` (see the model's method)."""
        request = DeleteCheckpointsRequest(steps=steps, best_checkpoint_metric=best_checkpoint_metric)
        body = request.model_dump(mode="json")
        return list(await self._request("POST", f"/models/{model.name}/checkpoints/delete", json=body))

    async def close(self) -> None:
        for model in self._models.values():
            await asyncio.to_thread(reporters.close, model.reporters)
        await self._http.aclose()


async def _result_of(events: AsyncIterator[Any], label: str, progress: bool) -> Any:
    """The result of a train route's event stream, with a progress bar; an error event raises ArtError."""
    result = None
    with progress_bar(label, unit="seq", show=progress) as bar:
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalBackend(RemoteBackend):
    """Runs `art-agents serve` on a free loopback port: a child process, or a thread with `in_process=True`.

    Needs the `server` extra (torch, transformers, peft, trl) in this Python environment. `path` is
    ART's name for `art_path`. The child process logs to `<art_path>/server.log` and cannot take the
    rollout code down with it; in process, the server shares this process (and its logging) and
    `close()` stops its thread. Both serve the same routes.
    """

    def __init__(
        self,
        art_path: str | Path | None = None,
        *,
        path: str | Path | None = None,
        in_process: bool = False,
        port: int | None = None,
        startup_timeout: float = 300.0,
    ) -> None:
        if art_path is not None and path is not None:
            raise ArtError("give the server folder once: LocalBackend(art_path) or LocalBackend(path=...), not both")
        self.art_path = Path(art_path or path or DEFAULT_ART_PATH).resolve()
        self.in_process = in_process
        self.port = port or _free_port()
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        super().__init__(f"http://127.0.0.1:{self.port}")

    @property
    def path(self) -> Path:
        """ART's name for `art_path`."""
        return self.art_path

    async def start(self) -> None:
        if self.in_process:
            await self._start_thread()
            return
        if self._process is not None and self._process.poll() is None:
            return
        self.art_path.mkdir(parents=True, exist_ok=True)
        log = open(self.art_path / "server.log", "ab")  # noqa: SIM115 - handed to the child process
        command = [
            sys.executable,
            "-m",
            "art_agents",
            "serve",
            "--art-path",
            str(self.art_path),
            "--port",
            str(self.port),
            "--exit-with-parent",
            str(os.getpid()),
        ]
        # Few malloc arenas: the server's worker threads otherwise each keep freed tensor memory.
        env = {"MALLOC_ARENA_MAX": "2", **os.environ}
        # Its own session: a Ctrl-C in the terminal reaches only this process, which then stops the server
        # in order (the server would otherwise die mid-request and bury the interrupt under its errors).
        self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        await self._wait_healthy()

    async def _start_thread(self) -> None:
        """Serve the app under uvicorn in a daemon thread of this process (what `art-agents serve` runs)."""
        if self._thread is not None and self._thread.is_alive():
            return
        try:
            import uvicorn

            from art_agents.server.http.app import create_app
        except ImportError as exc:
            raise ArtError(
                f"LocalBackend(in_process=True) needs the `server` extra ({exc}); pip install 'art-agents[server]'"
            ) from exc
        self.art_path.mkdir(parents=True, exist_ok=True)
        app = await asyncio.to_thread(create_app, self.art_path)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self._server = server = uvicorn.Server(config)
        self._thread_error = None

        def serve() -> None:
            try:
                server.run()
            except BaseException as exc:  # reported by _wait_healthy, not lost in a thread
                self._thread_error = exc

        self._thread = threading.Thread(target=serve, name=f"art-agents-server-{self.port}", daemon=True)
        self._thread.start()
        await self._wait_healthy()

    def _server_gone(self) -> str | None:
        """Why the server can no longer come up (it exited), or None while it may still."""
        if self.in_process:
            if self._thread is not None and not self._thread.is_alive():
                cause = f": {type(self._thread_error).__name__}: {self._thread_error}" if self._thread_error else ""
                return f"the in-process server stopped during start-up{cause} (see the log above)"
            return None
        if self._process is not None and self._process.poll() is not None:
            return (
                f"the local server exited with code {self._process.returncode}; see {self.art_path / 'server.log'} "
                "(is the `server` extra installed? pip install 'art-agents[server]')"
            )
        return None

    async def _wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if (gone := self._server_gone()) is not None:
                raise ArtError(gone)
            try:
                if (await self._http.get("/health", timeout=2)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
        where = "the log above" if self.in_process else self.art_path / "server.log"
        raise ArtError(f"the local server did not answer /health within {self.startup_timeout:.0f}s; see {where}")

    async def register(self, model: TrainableModel) -> ModelInfo:
        await self.start()
        return await super().register(model)

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self._stop_server)

    def _stop_server(self) -> None:
        """Stop the child process or the server thread (blocking; safe to call twice)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._process = None
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._server = self._thread = None

    async def __aenter__(self) -> LocalBackend:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __enter__(self) -> LocalBackend:
        """ART's `with LocalBackend() as backend:`; the server starts at the first `register`."""
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_server()  # the HTTP client cannot be closed without an event loop; `await close()` closes both

"""Backends: where a TrainableModel is served and trained.

`RemoteBackend` talks to an `art-agents serve` anywhere; `LocalBackend` starts one as a child
process on this machine and talks to it the same way, so both keep one contract (and a crash of
the training process cannot take the user's rollout code down with it).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from art_agents.errors import ArtError, ServerError
from art_agents.train_config import TrainConfig
from art_agents.trajectory import TrajectoryGroup, validate_groups
from art_agents.wire import (
    API_PREFIX,
    CheckpointInfo,
    DeleteCheckpointsRequest,
    ModelInfo,
    RegisterRequest,
    StepInfo,
    TrainEvent,
    TrainRequest,
    TrainResult,
)

# Where every command keeps its server folder unless told otherwise, so `art-agents report` finds it.
DEFAULT_ART_PATH = Path(".art")

if TYPE_CHECKING:
    import httpx

    from art_agents.model import TrainableModel


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
    ) -> TrainResult: ...
    async def list_checkpoints(self, model: TrainableModel) -> list[CheckpointInfo]: ...
    async def delete_checkpoints(self, model: TrainableModel, steps: list[int] | None = None) -> list[int]: ...
    async def close(self) -> None: ...


class RemoteBackend:
    """An art-agents server reached over HTTP (`api_key` is sent as a Bearer token)."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 600.0) -> None:
        import httpx  # lazy: httpx pulls in rich and click at import, too slow for `import art_agents`

        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout)

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = await self._http.request(method, API_PREFIX + path, **kwargs)
        except httpx.TransportError as exc:
            raise ArtError(f"cannot reach the art-agents server at {self.base_url}: {exc}; is it running?") from exc
        _raise_for_status(response)
        return response.json()

    async def register(self, model: TrainableModel) -> ModelInfo:
        body = RegisterRequest(name=model.name, project=model.project, base_model=model.base_model, config=model.config)
        return ModelInfo.model_validate(await self._request("POST", "/models", json=body.model_dump(mode="json")))

    async def get_step(self, model: TrainableModel) -> int:
        return StepInfo.model_validate(await self._request("GET", f"/models/{model.name}/step")).step

    async def train_events(
        self, model: TrainableModel, groups: list[TrajectoryGroup], config: TrainConfig
    ) -> AsyncIterator[TrainEvent]:
        import httpx

        body = TrainRequest(groups=groups, config=config).model_dump_json()
        url = f"{API_PREFIX}/models/{model.name}/train"
        try:
            async with self._http.stream(
                "POST", url, content=body, headers={"content-type": "application/json"}
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for_status(response)
                async for line in response.aiter_lines():
                    if line.strip():
                        yield TrainEvent.model_validate_json(line)
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
    ) -> TrainResult:
        """One GRPO step on the groups; returns when the new checkpoint is being served."""
        from tqdm import tqdm  # text bars: tqdm.auto widgets show blank or stuck at 0% in stored notebooks

        validate_groups(groups)
        result: TrainResult | None = None
        with tqdm(desc=f"train {model.name}", unit="seq", disable=not progress, leave=False) as bar:
            async for event in self.train_events(model, groups, config or TrainConfig()):
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

    async def list_checkpoints(self, model: TrainableModel) -> list[CheckpointInfo]:
        rows = await self._request("GET", f"/models/{model.name}/checkpoints")
        return [CheckpointInfo.model_validate(row) for row in rows]

    async def delete_checkpoints(self, model: TrainableModel, steps: list[int] | None = None) -> list[int]:
        body = DeleteCheckpointsRequest(steps=steps).model_dump(mode="json")
        return list(await self._request("POST", f"/models/{model.name}/checkpoints/delete", json=body))

    async def close(self) -> None:
        await self._http.aclose()


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
    """Runs `art-agents serve` as a child process on a free loopback port.

    Needs the `server` extra (torch, transformers, peft, trl) in this Python environment.
    Logs go to `<art_path>/server.log`.
    """

    def __init__(
        self, art_path: str | Path = DEFAULT_ART_PATH, *, port: int | None = None, startup_timeout: float = 300.0
    ) -> None:
        self.art_path = Path(art_path).resolve()
        self.port = port or _free_port()
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        super().__init__(f"http://127.0.0.1:{self.port}")

    async def start(self) -> None:
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

    async def _wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise ArtError(
                    f"the local server exited with code {self._process.returncode}; see {self.art_path / 'server.log'} "
                    "(is the `server` extra installed? pip install 'art-agents[server]')"
                )
            try:
                if (await self._http.get("/health", timeout=2)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
        raise ArtError(
            f"the local server did not answer /health within {self.startup_timeout:.0f}s; see {self.art_path / 'server.log'}"
        )

    async def register(self, model: TrainableModel) -> ModelInfo:
        await self.start()
        return await super().register(model)

    async def close(self) -> None:
        await super().close()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._process = None

    async def __aenter__(self) -> LocalBackend:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

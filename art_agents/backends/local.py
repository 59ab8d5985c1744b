"""LocalBackend: a TrainableModel served and trained on this machine.

`RemoteBackend` (`art_agents.backends.remote`) talks to an `art-agents serve` anywhere; `LocalBackend` starts one
as a child process on this machine and talks to it the same way, so both keep one contract (and a crash
of the training process cannot take the user's rollout code down with it). `LocalBackend(in_process=True)`
runs the same server in a thread of this process instead, as ART's `in_process` does.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from art_agents import parts
from art_agents.backends.ports import free_port
from art_agents.backends.remote import RegisteredModel, RemoteBackend
from art_agents.errors import ArtError
from art_agents.wire import ModelInfo

if TYPE_CHECKING:
    import uvicorn

# Where every command keeps its server folder unless told otherwise, so `art-agents report` finds it.
DEFAULT_ART_PATH = Path(".art")


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
        self.port = port or free_port()
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

            create_app = parts.load(parts.SERVER_APP)
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

    async def register(self, model: RegisteredModel) -> ModelInfo:
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

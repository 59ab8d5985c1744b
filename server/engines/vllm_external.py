"""A vLLM server that someone else started and supervises (ART's `vllm_runtime={"mode": "external"}`).

The engine drives it as it drives its own `vllm serve` process (vllm_process.py): the same routes, LoRA hot-load
included, so it must run with the flags this project would give it (`required_command`) and
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and must read the checkpoint folders from the same paths. It is never
started, restarted or stopped from here; when it stops answering, requests fail with a 503 saying so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import httpx

from art_agents.server.engines.vllm_process import VLLMUnavailable

API_KEY_ENV = "VLLM_API_KEY"  # vLLM's own variable for `--api-key`


class ExternalVLLM:
    def __init__(self, base_url: str, startup_timeout_s: float, required_command: str) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.startup_timeout_s = startup_timeout_s
        self.required = required_command
        self.on_restart: Callable[[], None] | None = None  # never called: its restarts are not seen from here
        key = os.environ.get(API_KEY_ENV)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    pid = None
    ready = True

    def start(self) -> None:
        self.wait_ready(self.startup_timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{self.base_url}/health", headers=self.headers, timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() >= deadline:
                raise VLLMUnavailable(self._unreachable(f"did not answer /health within {timeout_s:.0f} s"))
            time.sleep(0.25)

    def died_message(self, pid: int | None) -> str:
        return self._unreachable("stopped answering")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Nothing to stop: the server is not ours."""

    def _unreachable(self, what: str) -> str:
        return (
            f"the external vLLM server at {self.base_url} {what}; art-agents does not start it: run "
            f"`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True {self.required}` (ModelConfig.vllm_server_url or vllm_nodes)"
        )

"""The vLLM engine: sampling by a supervised `vllm serve` process; training publishes each checkpoint to it.

The engine speaks vLLM's HTTP API (pinned in pyproject's `vllm` extra; shapes read from its
`completion/protocol.py`, `serve/lora` and `serve/dev/sleep` routes):

- Prompts go to `/v1/completions` as token ids, rendered by our chat template as for the
  transformers engine, so there is one template and one tool-call parser. Each request streams
  (`on_token`, and closing the stream on `cancel` makes vLLM abort it) with `return_token_ids`,
  `logprobs=0` (the sampled token's) and `return_tokens_as_token_ids`.
- Logprobs are at the sampling temperature, as the transformers engine's: vLLM runs with
  `--logprobs-mode processed_logprobs` (its default, raw, is temperature 1). vLLM's processed
  logprobs are also after top-p, so a request with top_p < 1 records logprobs renormalised over the
  nucleus (the token store keeps its top_p; the trainer's sampler-drift metric shows the gap).
  Sampling knobs a model's generation_config would default (top_k, penalties) are sent neutral.
- Each checkpoint is a LoRA adapter named `name@step` (`/v1/load_lora_adapter`), and every request
  names its adapter in `model`. vLLM answers an unknown adapter with 404, never the base model, and
  the engine also checks the answer's `model`: a sample's step is the adapter that produced it.
- A new step is loaded by `publish_checkpoint` before training commits it; if vLLM rejects it, the
  step fails and the last good checkpoint keeps serving. Older steps load on demand (two kept).
- `beside_training()` puts vLLM to sleep (`/sleep?level=1`, `/wake_up`) while a step trains when it shares the GPU.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import shlex
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from art_agents.server.engines.prefix_cache import PrefillTokens
from art_agents.server.engines.protocol import EngineBusy, OlderStep, Sample, SamplingParams, TokenCallback
from art_agents.server.engines.requests import truncate_at_stop
from art_agents.server.engines.vllm_external import ExternalVLLM
from art_agents.server.engines.vllm_process import VLLMLaunch, VLLMProcess, VLLMUnavailable, vllm_python
from art_agents.server.errors import ServiceError
from art_agents.server.models.lora_model import load_generation_config, load_tokenizer, stop_token_ids, training_gpus
from art_agents.server.storage.checkpoints import checkpoint_path
from art_agents.train_config import ModelConfig

log = logging.getLogger("art_agents.server")

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's MaxLoRARanks
KEEP_OLDER = 2  # older steps kept loaded beside the latest
ADMIN_TIMEOUT_S = 300.0  # a LoRA load or wake-up on a big model takes seconds; never forever
NEUTRAL = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


class VLLMError(ServiceError):
    """vLLM refused or broke a request (a rejected adapter, a wrong answer); the message says which."""

    def __init__(self, detail: str) -> None:
        super().__init__(502, detail)


def vllm_args(config: ModelConfig, sleep: bool) -> list[str]:
    """The `vllm serve` flags for a model config."""
    rank = next((r for r in LORA_RANKS if r >= config.lora_rank), None)
    if rank is None:
        raise ServiceError(400, f"lora_rank={config.lora_rank} exceeds vLLM's largest LoRA rank {LORA_RANKS[-1]}")
    dtype = "bfloat16" if config.dtype == "auto" else config.dtype  # the trainer's dtype on a GPU
    args = [
        "--enable-lora",
        f"--max-lora-rank={rank}",
        f"--max-loras={KEEP_OLDER + 1}",
        f"--gpu-memory-utilization={config.gpu_memory_utilization}",
        "--logprobs-mode=processed_logprobs",
        f"--dtype={dtype}",
        "--enable-prefix-caching" if config.prefix_cache_mb > 0 else "--no-enable-prefix-caching",
        f"--tensor-parallel-size={config.tensor_parallel_size}",
        f"--data-parallel-size={config.data_parallel_size}",
    ]
    return [*args, "--enable-sleep-mode"] if sleep else args


class VLLMEngine:
    """Serves a model's checkpoints from vLLM; no weights live in this process."""

    def __init__(
        self, tokenizer: Any, stop_ids: set[int], config: ModelConfig, *, name: str, model_dir: Path, sleep: bool
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.name = name
        self.model_dir = model_dir
        self.sleep = sleep
        self.longest_token_bytes = max((len(t.encode()) for t in tokenizer.get_vocab()), default=1)
        self._stop_ids = sorted(stop_ids)
        self.prefill_tokens = PrefillTokens()  # vLLM counts its own (its /metrics); none are reported per step
        self.step = 0  # the served step: its adapter is in vLLM (`publish_checkpoint`) or loads on first use
        self._loaded: collections.OrderedDict[int, Path] = collections.OrderedDict()  # step -> folder, in vLLM
        self._stale: set[int] = set()  # steps to unload once vLLM is awake
        self._asleep = False
        self._admin = threading.RLock()  # adapter bookkeeping is touched by worker threads and the watcher
        self._gate = asyncio.Condition()
        self._active = 0  # requests past the gate
        self._requests = 0  # requests in the engine, waiting or active
        self._holding = False  # paused() holds the gate
        self.process: VLLMProcess | ExternalVLLM | None = None

    @classmethod
    def load(cls, base_model: str, config: ModelConfig, *, name: str, model_dir: Path) -> VLLMEngine:
        """Start vLLM first (it checks that its share of GPU memory is free), then load the tokenizer."""
        if config.gguf_file:
            raise ServiceError(400, "gguf_file is served by the transformers engine only; use engine='transformers'")
        vllm_gpus = set(range(config.tensor_parallel_size * config.data_parallel_size))  # the first visible ones
        shares_gpu = bool(training_gpus(config) & vllm_gpus) and not config.vllm_server_url
        sleep = shares_gpu if config.vllm_sleep_mode is None else config.vllm_sleep_mode
        process: VLLMProcess | ExternalVLLM
        if config.vllm_server_url:
            command = shlex.join(["vllm", "serve", base_model, *vllm_args(config, sleep)])
            process = ExternalVLLM(config.vllm_server_url, config.vllm_startup_timeout, command)
        else:
            launch = VLLMLaunch(
                python=vllm_python(),
                base_model=base_model,
                args=vllm_args(config, sleep),
                log_path=model_dir / "vllm.log",
                startup_timeout_s=config.vllm_startup_timeout,
                env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **({"VLLM_SERVER_DEV_MODE": "1"} if sleep else {})},
            )
            process = VLLMProcess(launch)
        process.start()
        try:
            tokenizer = load_tokenizer(base_model, config)
            stop_ids = stop_token_ids(load_generation_config(base_model, config), tokenizer)
        except BaseException:
            process.stop()
            raise
        engine = cls(tokenizer, stop_ids, config, name=name, model_dir=model_dir, sleep=sleep)
        engine.process = process
        process.on_restart = engine._reload_after_restart
        return engine

    # --- the step and its adapters ------------------------------------------------------

    def adapter(self, step: int) -> str:
        return f"{self.name}@{step}"

    def base_weights(self) -> None:
        return None  # they live in the vLLM process

    def load_adapter(self, path: str | Path) -> None:
        """Serve the current step from its checkpoint (opening, rollback): vLLM drops steps after it."""
        with self._admin:
            self._stale.update(s for s in self._loaded if s > self.step)  # published, then rolled back

    def publish_checkpoint(self, step: int, path: Path) -> None:
        """Load checkpoint `step` into vLLM before it is served; raises (the step is rolled back) if vLLM refuses.

        Called by training from a worker thread, while the engine is paused (vLLM is woken for it).
        A step published before (then rolled back) is unloaded first: its weights may differ now.
        """
        with self._admin:
            self._wake()
            if step in self._loaded:
                self._unload(step)
            self._ensure(step, path)

    def forget_older(self) -> None:
        """Unload every older step (their folders may be deleted or replaced); done once vLLM is awake."""
        with self._admin:
            self._stale.update(s for s in self._loaded if s != self.step)

    def _ensure(self, step: int, path: Path) -> None:
        """`name@step` loaded in vLLM, the least recent older step unloaded beyond KEEP_OLDER (runs in a thread)."""
        with self._admin:
            self._drop_stale()
            if step not in self._loaded:
                body = {"lora_name": self.adapter(step), "lora_path": str(path)}
                response = self._post("/v1/load_lora_adapter", json=body)
                if response.status_code != 200:
                    where = self._running().base_url
                    raise VLLMError(
                        f"vLLM refused checkpoint {step} of model {self.name!r} ({path}) on {where}: "
                        f"{_error_of(response)}"
                    )
                self._loaded[step] = path
            self._loaded.move_to_end(step)
            older = [s for s in self._loaded if s not in (step, self.step)]
            for evicted in older[: max(0, len(older) - KEEP_OLDER)]:
                self._unload(evicted)

    def _unload(self, step: int) -> None:
        response = self._post("/v1/unload_lora_adapter", json={"lora_name": self.adapter(step)})
        if response.status_code not in (200, 404):  # 404: vLLM does not have it (restarted)
            raise VLLMError(f"vLLM could not unload {self.adapter(step)}: {_error_of(response)}")
        self._loaded.pop(step, None)

    def _drop_stale(self) -> None:
        for step in sorted(self._stale):
            if step in self._loaded:
                self._unload(step)
        self._stale.clear()

    def _reload_after_restart(self) -> None:
        """After vLLM restarted it has no adapters: load the served step's again (the watcher thread calls this)."""
        with self._admin:
            self._loaded.clear()
            self._stale.clear()
            self._asleep = False
            self._ensure(self.step, checkpoint_path(self.model_dir, self.step))
        log.info("vLLM restarted; %s reloaded", self.adapter(self.step))

    # --- sleep and wake -----------------------------------------------------------------

    def paused(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold new requests and wait for those running, until exit."""
        return self._held(sleep=False)

    def beside_training(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Sleep while a step trains if vLLM shares the trainer's GPU (its memory is the trainer's meanwhile)."""
        return self._held(sleep=True) if self.sleep else contextlib.nullcontext()

    @contextlib.asynccontextmanager
    async def _held(self, *, sleep: bool) -> AsyncIterator[None]:
        async with self._gate:
            await self._gate.wait_for(lambda: not self._holding)
            self._holding = True
            await self._gate.wait_for(lambda: self._active == 0)
        try:
            if sleep:
                await asyncio.to_thread(self._sleep)
            yield
        finally:
            try:
                await asyncio.to_thread(self._wake_and_tidy)
            finally:
                async with self._gate:
                    self._holding = False
                    self._gate.notify_all()

    def _sleep(self) -> None:
        with self._admin:
            self._check(self._post("/sleep", params={"level": 1}), "sleep")
            self._asleep = True

    def _wake(self) -> None:
        with self._admin:
            if self._asleep:
                self._check(self._post("/wake_up"), "wake up")
                self._asleep = False

    def _wake_and_tidy(self) -> None:
        with self._admin:
            self._wake()
            self._drop_stale()

    # --- generation ---------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_token: TokenCallback | None = None,
        older: OlderStep | None = None,
        cancel: threading.Event | None = None,
        route: str | None = None,
    ) -> list[Sample]:
        """Sample `params.n` choices from `name@step` (the latest, or `older`); see the module docstring."""
        if self._requests >= self.config.max_queued_requests:
            raise EngineBusy(self._requests)
        self._requests += 1
        try:
            async with self._gate:
                await self._gate.wait_for(lambda: not self._holding)
                self._active += 1
            try:
                step = self.step if older is None else older.step
                path = older.checkpoint if older is not None else checkpoint_path(self.model_dir, step)
                process = self._running()
                if not process.ready:  # a restart is under way
                    await asyncio.to_thread(process.wait_ready, self.config.vllm_startup_timeout)
                if step != self.step or step not in self._loaded or self._stale:  # else no thread hop
                    await asyncio.to_thread(self._ensure, step, path)
                return await self._complete(prompt_ids, params, step, on_token, cancel)
            finally:
                async with self._gate:
                    self._active -= 1
                    self._gate.notify_all()
        finally:
            self._requests -= 1

    async def _complete(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        step: int,
        on_token: TokenCallback | None,
        cancel: threading.Event | None,
    ) -> list[Sample]:
        process = self._running()
        pid = process.pid
        body = {
            "model": self.adapter(step),
            "prompt": list(prompt_ids),
            "max_tokens": params.max_tokens,
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": params.stop,
            "stop_token_ids": self._stop_ids,
            "seed": params.seed,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "stream": True,
            **NEUTRAL,
        }
        ids: list[list[int]] = [[] for _ in range(params.n)]
        logprobs: list[list[float]] = [[] for _ in range(params.n)]
        finish: list[str | None] = [None] * params.n
        try:
            async with (
                httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10)) as client,
                client.stream(
                    "POST", f"{process.base_url}/v1/completions", json=body, headers=process.headers
                ) as response,
            ):
                if response.status_code != 200:
                    await response.aread()
                    raise VLLMError(f"vLLM refused {self.adapter(step)}: {_error_of(response)}")
                async for chunk in _events(response):
                    for choice in self._choices(chunk, step, prompt_ids):
                        i, new = choice["index"], choice["token_ids"]
                        ids[i] += new
                        logprobs[i] += choice["logprobs"]["token_logprobs"]
                        finish[i] = choice.get("finish_reason") or finish[i]
                        if on_token is not None:
                            for token in new:
                                on_token(i, token)
                    if cancel is not None and cancel.is_set():
                        break  # closing the stream makes vLLM abort the request
        except httpx.TransportError as exc:
            raise VLLMUnavailable(await asyncio.to_thread(process.died_message, pid)) from exc
        return [self._sample(ids[i], logprobs[i], finish[i], params, step) for i in range(params.n)]

    def _choices(self, chunk: dict[str, Any], step: int, prompt_ids: list[int]) -> list[dict[str, Any]]:
        """A stream chunk's choices, checked: it must come from the adapter asked for and carry token ids."""
        if "error" in chunk:
            raise VLLMError(f"vLLM failed mid-stream on {self.adapter(step)}: {chunk['error'].get('message')}")
        if chunk.get("model") != self.adapter(step):
            raise VLLMError(f"vLLM answered as {chunk.get('model')!r} when asked for {self.adapter(step)!r}")
        choices = chunk.get("choices", [])
        for choice in choices:
            if choice.get("token_ids") is None or choice.get("logprobs") is None:
                raise VLLMError("vLLM sent no token ids or logprobs: it needs return_token_ids (vllm>=0.10.2)")
            given = choice.get("prompt_token_ids")
            if given is not None and given != prompt_ids:
                raise VLLMError("vLLM sampled from a different prompt than the token ids sent")
        return choices

    def _sample(
        self, ids: list[int], logprobs: list[float], finish: str | None, params: SamplingParams, step: int
    ) -> Sample:
        """A choice in the transformers engine's terms: text decoded by our tokenizer, cut at a stop string."""
        if len(logprobs) != len(ids):
            raise VLLMError(f"vLLM sent {len(logprobs)} logprobs for {len(ids)} tokens")
        reason = {"stop": "stop", "length": "length"}.get(finish or "", "cancelled")
        shown = ids[:-1] if reason == "stop" and ids and ids[-1] in self._stop_ids else ids
        text = self.tokenizer.decode(shown, skip_special_tokens=True)
        if params.stop:
            text = truncate_at_stop(text, params.stop) or text
        return Sample(
            token_ids=ids,
            logprobs=logprobs,
            text=text,
            finish_reason=reason,  # type: ignore[arg-type]
            step=step,
            temperature=params.logprob_temperature,
        )

    # --- plumbing -----------------------------------------------------------------------

    def _running(self) -> VLLMProcess | ExternalVLLM:
        if self.process is None:
            raise VLLMUnavailable("vLLM was stopped (the server is shutting down)")
        return self.process

    def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        process = self._running()
        pid = process.pid
        try:
            return httpx.post(f"{process.base_url}{path}", timeout=ADMIN_TIMEOUT_S, headers=process.headers, **kwargs)
        except httpx.TransportError as exc:
            raise VLLMUnavailable(process.died_message(pid)) from exc

    @staticmethod
    def _check(response: httpx.Response, what: str) -> None:
        if response.status_code != 200:
            raise VLLMError(f"vLLM could not {what}: {_error_of(response)}")

    def stop(self) -> None:
        """Stop vLLM if this server started it (an external one is never stopped from here)."""
        process, self.process = self.process, None
        if process is not None:
            process.stop()

    async def close(self) -> None:
        await asyncio.to_thread(self.stop)


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of a server-sent event stream, up to `data: [DONE]`."""
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            return
        yield json.loads(data)


def _error_of(response: httpx.Response) -> str:
    """vLLM's error message (`{"error": {"message"}}`, or FastAPI's `detail`), else the body."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:2000]}"
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return f"HTTP {response.status_code}: {body['error'].get('message')}"
    if isinstance(body, dict) and "detail" in body:
        return f"HTTP {response.status_code}: {body['detail']}"
    return f"HTTP {response.status_code}: {str(body)[:2000]}"

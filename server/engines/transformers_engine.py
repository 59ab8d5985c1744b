"""The transformers engine: generate completions from the served LoRA, with token ids and logprobs.

`TransformersEngine` runs everywhere (CPU or GPU). It batches continuously: a worker thread decodes
every running row one token per pass, a request that arrives joins at the next pass (its prompt
prefilled once for all its choices and for identical prompts arriving with it), and a finished
row leaves at once. Each row keeps its own sampling settings and, when seeded, its own random
stream, so a seeded request samples the same tokens whatever it is batched with.
The loop is written out (not `model.generate`) because it must return, per token, the logprob the
trainer will recompute: log-softmax of the logits divided by the sampling temperature (1 for greedy),
before top-p. The trainer trains that tempered, untruncated policy; top-p only narrows which tokens
get drawn, and the sampler's logprobs on the same basis make any gap between the two measurable.

The engine serves on while a step trains: the trainer trains its own LoRA over the same base weights
(`base_weights`), unless it samples in a precision of its own (`ModelConfig.serving_dtype`: bf16 or int8 weights,
read faster per token; models/serving_precision.py). Publishing step N+1 pauses it briefly (running rows finish, none join; requests that arrive
meanwhile wait in the queue and are served by the new step) while the new adapter weights are loaded.

A prefix cache (`ModelConfig.prefix_cache_mb`) keeps the KV state of prompts and finished rows, so a prompt
prefills only what follows its longest cached prefix. It holds the current step's adapter only: it is emptied
whenever the weights may change (after every pause, such as a publish, and on loading an adapter), and
requests for an older step neither use nor fill it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from art_agents.server.engines.kv_batch import KVBatch
from art_agents.server.engines.prefix_cache import PrefillTokens, PrefixCache
from art_agents.server.engines.protocol import EngineBusy, OlderStep, Sample, SamplingParams, TokenCallback
from art_agents.server.engines.requests import Request, Row, truncate_at_stop
from art_agents.server.engines.sampler import row_random, sample
from art_agents.server.engines.stream_text import IncrementalDecoder
from art_agents.server.host.memory import trim_heap
from art_agents.server.models.lora_model import load_lora_weights, load_peft_model, stop_token_ids
from art_agents.server.models.serving_precision import serves_apart, serving_copy, serving_dtype
from art_agents.train_config import ModelConfig

log = logging.getLogger("art_agents.server")


def _decoding_thread() -> concurrent.futures.ThreadPoolExecutor:
    """One long-lived thread that does all of an engine's decoding: torch keeps its intra-op (OpenMP) thread team
    per calling thread, so decoding on whichever pool thread is free leaves idle teams competing for the cores
    (measured: 20-25% slower per token on 2 cores)."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="art-engine")


class TransformersEngine:
    """Batched sampling from a PEFT model with transformers, on CPU or GPU."""

    def __init__(
        self, model: Any, tokenizer: Any, config: ModelConfig, *, step: int = 0, training_base: Any | None = None
    ) -> None:
        self.model = model
        self._training_base = training_base  # the trainer's base, when `model` samples in a precision of its own
        self.tokenizer = tokenizer
        self.config = config
        self.step = step
        self.device = next(model.parameters()).device
        self._stop_ids = stop_token_ids(model.generation_config, tokenizer)
        self.longest_token_bytes = max((len(t.encode()) for t in tokenizer.get_vocab()), default=1)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self._stop_ids, default=0)
        # transformers 5.2x renamed `past_key_values` to `cache` (argument and output); use what this model takes
        forward = inspect.signature(model.get_base_model().forward).parameters
        self._cache_kw = "cache" if "cache" in forward else "past_key_values"
        self._pending: collections.deque[Request] = collections.deque()
        self._wakeup = asyncio.Event()
        self._gate = asyncio.Lock()  # held by a running batch or by training
        self._lock = threading.Lock()  # the worker thread takes from `_pending` while the event loop adds
        self._holds = 0  # paused() callers waiting: admit no more rows
        self._worker: asyncio.Task[None] | None = None
        self._thread = _decoding_thread()
        self._older: collections.OrderedDict[int, str] = collections.OrderedDict()  # step -> loaded adapter name
        self.prefix_cache = PrefixCache(int(config.prefix_cache_mb * 2**20)) if config.prefix_cache_mb > 0 else None
        self.prefill_tokens = PrefillTokens()

    @classmethod
    def load(cls, base_model: str, config: ModelConfig) -> TransformersEngine:
        model, tokenizer = load_peft_model(base_model, config)
        device = str(next(model.parameters()).device)
        if serves_apart(config, device):
            return cls(serving_copy(model, serving_dtype(config, device)), tokenizer, config, training_base=model)
        return cls(model, tokenizer, config)

    def base_weights(self) -> Any:
        return self.model if self._training_base is None else self._training_base

    def load_adapter(self, path: str | Path) -> None:
        """Serve a checkpoint's adapter weights (opening, rollback, publishing a step)."""
        self._forget_prefixes()
        load_lora_weights(self.model, path)

    def publish_checkpoint(self, step: int, path: Path) -> None:
        self.load_adapter(path)

    @contextlib.asynccontextmanager
    async def beside_training(self) -> AsyncIterator[None]:
        """Serve on: the trainer trains its own adapter over the shared base weights."""
        yield

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Hold generation (the running rows finish first, none join); queued requests wait until exit."""
        self._holds += 1
        try:
            async with self._gate:
                yield
        finally:
            self._forget_prefixes()  # the weights may have changed meanwhile (training, a rollback)
            self._holds -= 1
            self._wakeup.set()

    def _forget_prefixes(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_token: TokenCallback | None = None,
        older: OlderStep | None = None,
        cancel: threading.Event | None = None,
        route: str | None = None,
    ) -> list[Sample]:
        """Sample `params.n` choices; `on_token` (if given) sees each token as it is sampled, for streaming.

        `older` samples from an earlier checkpoint instead of the latest (evaluating the base model,
        step 0, beside the trained one); its samples carry that step. Once `cancel` is set the
        choices end at the next token (finish reason "cancelled"), freeing the batch.
        """
        if len(self._pending) >= self.config.max_queued_requests:
            raise EngineBusy(len(self._pending))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run(), name="art-engine")
        future: asyncio.Future[list[Sample]] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._pending.append(Request(list(prompt_ids), params, future, on_token, older, cancel))
        self._wakeup.set()
        return await future

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        self._thread.shutdown(wait=False)  # its thread ends after the running batch
        self._thread = _decoding_thread()

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            older = self._pending[0].older
            async with self._gate:
                await asyncio.get_running_loop().run_in_executor(self._thread, self._serve, older)
            if not self._pending:
                trim_heap()

    def _serve(self, older: OlderStep | None) -> None:
        """Decode requests for one checkpoint, admitting more as they arrive, until none is left (worker thread)."""
        if older is None or older.step == self.step:
            self._run_batch(older, self.step)
            return
        self.model.set_adapter(self._older_adapter(older))
        try:
            self._run_batch(older, older.step)
        finally:
            self.model.set_adapter("default")  # also makes only "default" trainable again

    def _older_adapter(self, older: OlderStep, keep: int = 2) -> str:
        """The adapter name of an older checkpoint, loaded (frozen) on first use; the least recent of more
        than `keep` is unloaded."""
        name = self._older.get(older.step)
        if name is None:
            name = f"step_{older.step}"
            self.model.load_adapter(str(older.checkpoint), adapter_name=name, is_trainable=False)
            self._older[older.step] = name
            while len(self._older) > keep:
                _, evicted = self._older.popitem(last=False)
                self.model.delete_adapter(evicted)
        self._older.move_to_end(older.step)
        return name

    def forget_older(self) -> None:
        """Unload every older checkpoint's adapter (their folders may have been deleted or replaced)."""
        while self._older:
            _, name = self._older.popitem()
            self.model.delete_adapter(name)

    def _take(self, older: OlderStep | None, running: int) -> list[Request]:
        """Waiting requests that join a batch of `running` rows, oldest first: up to max_batch_size rows, all for
        `older`'s checkpoint (a request for another stops admission, so that checkpoint is served next)."""
        if self._holds:
            return []
        taken: list[Request] = []
        rows = running
        with self._lock:
            for request in self._pending:
                if request.older != older or (request.alone and (taken or running)):
                    break
                if (taken or running) and rows + request.params.n > self.config.max_batch_size:
                    break
                taken.append(request)
                rows += request.params.n
                if request.alone:
                    break
            for request in taken:
                self._pending.remove(request)
        return taken

    def _await_arrivals(self) -> None:
        """Give requests sent together (a group's rollouts) a short, bounded window to arrive together, so their
        prompts are prefilled in one pass and identical ones once: it ends at `admission_window_ms`, when
        max_batch_size rows wait, or once no request has arrived for a millisecond."""
        deadline = time.monotonic() + self.config.admission_window_ms / 1000
        seen = -1
        while not self._holds and (now := time.monotonic()) < deadline:
            waiting = [r.params.n for r in list(self._pending)]
            if sum(waiting) >= self.config.max_batch_size or len(waiting) == seen:
                return
            seen = len(waiting)
            time.sleep(min(0.001, deadline - now))

    def _run_batch(self, older: OlderStep | None, step: int) -> None:
        """The continuous batch: each pass feeds every running row one token and prefills the requests that
        arrived meanwhile; a finished row leaves at once and its request is answered when all its choices are."""
        import torch

        prefixes = self.prefix_cache if step == self.step else None  # an older step's adapter computes other KV

        def new_batch() -> KVBatch:
            return KVBatch(self.model, self._cache_kw, self._pad_id, self.device, prefixes)

        batch = new_batch()
        rows: list[Row] = []
        while True:
            if not rows:
                self._await_arrivals()
            arrivals = self._take(older, len(rows)) if not rows or batch.joinable else []
            if not rows and not arrivals:
                return
            try:
                with torch.inference_mode():
                    if rows:
                        self._advance(rows, batch.step([row.ids[-1] for row in rows]), step)
                    if arrivals:
                        rows += self._join(batch, arrivals, step)
                    staying = [i for i, row in enumerate(rows) if row.finish is None]
                    for i, row in enumerate(rows):
                        if row.finish is not None:
                            batch.remember(i, row.ids)  # the next turn of its conversation extends it
                    if len(staying) < len(rows):
                        batch.keep(staying)
                        rows = [rows[i] for i in staying]
            except Exception as exc:
                self._fail({id(r.request): r.request for r in rows} | {id(r): r for r in arrivals}, exc)
                batch, rows = new_batch(), []

    def _join(self, batch: KVBatch, arrivals: list[Request], step: int) -> list[Row]:
        """Prefill the arrivals' distinct prompts once, add a row per choice, and sample each row's first token."""
        distinct: dict[tuple[int, ...], int] = {}
        rows, copies = [], []
        for request in arrivals:
            request.samples = [None] * request.params.n
            prompt = distinct.setdefault(tuple(request.prompt_ids), len(distinct))
            for choice in range(request.params.n):
                seed = None if request.params.seed is None else request.params.seed + choice
                decoder = IncrementalDecoder(self.tokenizer) if request.params.stop else None
                rows.append(Row(request, choice, row_random(seed), decoder))
                copies.append(prompt)
        try:
            order, logits = batch.join(list(distinct), copies)
        except Exception as exc:  # the running rows are untouched: only the arrivals fail, or retry one at a time
            if len(arrivals) == 1:
                self._answer(arrivals[0], exc)
            else:
                self._requeue_alone(arrivals)
            return []
        self._count_prefill(arrivals, batch.computed)
        rows = [rows[entry] for entry in order]
        self._advance(rows, logits, step)
        return rows

    def _count_prefill(self, arrivals: list[Request], computed: dict[tuple[int, ...], int]) -> None:
        """Count and log each request's prompt tokens computed and served from cache (a prompt computed once for
        several requests counts for the first; one copied from a running row is served from cache)."""
        counts = []
        for request in arrivals:
            done = computed.pop(tuple(request.prompt_ids), 0)
            counts.append(f"{done}/{len(request.prompt_ids) - done}")
            self.prefill_tokens.add(done, len(request.prompt_ids) - done)
        log.info("prefill of %d requests, tokens computed/from the prefix cache: %s", len(arrivals), " ".join(counts))

    def _advance(self, rows: list[Row], logits: Any, step: int) -> None:
        """Sample each row's next token from its logits; finish rows that stopped, were cancelled or ran out."""
        params = [row.request.params for row in rows]
        tokens, logprobs = sample(  # in fp32 whatever the engine's precision: bf16 logprobs would add their own gap
            logits.float(),
            [p.temperature for p in params],
            [p.top_p for p in params],
            [row.random.random() for row in rows],
        )
        for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
            request = row.request
            if request.cancel is not None and request.cancel.is_set():
                self._finish(row, "cancelled", self._decode(row.ids), step)
                continue
            row.ids.append(token)
            row.logprobs.append(logprob)
            if request.on_token is not None:
                request.streamed = True
                request.on_token(row.choice, token)
            reason, text = self._check_finish(row, token)
            if reason is not None:
                self._finish(row, reason, text or "", step)

    def _finish(self, row: Row, reason: str, text: str, step: int) -> None:
        row.finish = reason
        request = row.request
        request.samples[row.choice] = Sample(
            token_ids=row.ids,
            logprobs=row.logprobs,
            text=text,
            finish_reason=reason,  # type: ignore[arg-type]
            step=step,
            temperature=request.params.logprob_temperature,
        )
        if all(sample is not None for sample in request.samples):
            self._answer(request, list(request.samples))  # type: ignore[arg-type]

    def _fail(self, requests: dict[int, Request], exc: Exception) -> None:
        """A failed pass: requests that streamed tokens fail with it; the others are retried one at a time, so one
        bad request fails alone instead of taking the others down with it."""
        retry = []
        for request in requests.values():
            if request.future.done() or (request.samples and all(s is not None for s in request.samples)):
                continue  # answered already
            if request.streamed or request.alone or len(requests) == 1:
                self._answer(request, exc)
            else:
                retry.append(request)
        self._requeue_alone(retry)

    def _requeue_alone(self, requests: list[Request]) -> None:
        with self._lock:
            for request in reversed(requests):
                request.alone, request.samples = True, []
                self._pending.appendleft(request)

    @staticmethod
    def _answer(request: Request, outcome: list[Sample] | Exception) -> None:
        """Resolve a request's future from the worker thread (skipped if its client already gave up)."""

        def settle() -> None:
            if request.future.done():
                return
            if isinstance(outcome, Exception):
                request.future.set_exception(outcome)
            else:
                request.future.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            request.future.get_loop().call_soon_threadsafe(settle)

    def _check_finish(self, row: Row, token: int) -> tuple[str | None, str | None]:
        """(finish_reason, text) once the row is done, else (None, None); `row.text` follows rows with stop strings."""
        if token in self._stop_ids:
            return "stop", self._decode(row.ids[:-1])
        if row.text is not None and row.text.push(token):
            cut = truncate_at_stop(row.text.text, row.request.params.stop)
            if cut is not None:
                return "stop", cut
        if len(row.ids) >= row.request.params.max_tokens:
            return "length", self._decode(row.ids)
        return None, None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

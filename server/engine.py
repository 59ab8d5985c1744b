"""Engines: generate completions from the served LoRA, with token ids and logprobs.

`TransformersEngine` runs everywhere (CPU or GPU). Concurrent requests queue up and are batched
into one left-padded decoding loop; each row keeps its own sampling settings and, when seeded, its
own random generator, so a seeded request samples the same tokens whatever it is batched with.
The loop is written out (not `model.generate`) because it must return, per token, the logprob the
trainer will recompute: log-softmax of the logits divided by the sampling temperature (1 for greedy),
before top-p. The trainer trains that tempered, untruncated policy; top-p only narrows which tokens
get drawn, and the sampler's logprobs on the same basis make any gap between the two measurable.

The service pauses the engine while training updates `engine.model` in place; requests that
arrive meanwhile wait in the queue and are served by the new step.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from art_agents.server.memory import trim_heap
from art_agents.server.stream_text import IncrementalDecoder
from art_agents.train_config import ModelConfig


@dataclass
class SamplingParams:
    max_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    @property
    def logprob_temperature(self) -> float:
        """The temperature logprobs are taken at: the sampling one, or 1 for greedy decoding."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class Sample:
    """One choice: the sampled ids, their logprobs, the text they decode to, and why it ended."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: Literal["stop", "length", "cancelled"]
    step: int
    temperature: float = 1.0  # of the logprobs


class Engine(Protocol):
    """What the service needs from an engine (the vLLM engine implements the same)."""

    model: Any  # a peft.PeftModel with adapter "default"; the trainer updates it in place
    tokenizer: Any
    step: int
    longest_token_bytes: int  # the most bytes one token stands for: sizes requests before tokenizing

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_token: TokenCallback | None = None,
        older: OlderStep | None = None,
        cancel: threading.Event | None = None,
    ) -> list[Sample]: ...
    def load_adapter(self, path: str | Path) -> None: ...
    def forget_older(self) -> None: ...
    def paused(self) -> contextlib.AbstractAsyncContextManager[None]: ...
    async def close(self) -> None: ...


TokenCallback = Callable[[int, int], None]
"""Called from the engine's worker thread with (choice index, token id) as each token is sampled."""


class EngineBusy(RuntimeError):
    """The engine's queue is full (`ModelConfig.max_queued_requests`); the client should retry later."""

    def __init__(self, queued: int) -> None:
        super().__init__(f"the engine already has {queued} requests waiting; retry later")


@dataclass(frozen=True)
class OlderStep:
    """A checkpoint before the latest, served on request (`name@N`): its step and folder."""

    step: int
    checkpoint: Path


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[list[Sample]]
    on_token: TokenCallback | None = None
    older: OlderStep | None = None
    cancel: threading.Event | None = None  # set when the client went away: stop at the next token
    streamed: bool = False  # tokens already went out to the client


def _device(config: ModelConfig) -> str:
    import torch

    if config.device != "auto":
        return config.device
    return "cuda" if torch.cuda.is_available() else "cpu"


def _dtype(config: ModelConfig, device: str) -> Any:
    import torch

    if config.dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, config.dtype)


def load_peft_model(base_model: str, config: ModelConfig) -> tuple[Any, Any]:
    """The base model with a fresh LoRA adapter "default" (seeded), and its tokenizer."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = _device(config)
    extra = {"gguf_file": config.gguf_file} if config.gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(base_model, **extra)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=_dtype(config, device), **extra).to(device)
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=list(config.target_modules),
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        peft_model = get_peft_model(model, lora)
    peft_model.eval()
    return peft_model, tokenizer


def stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for value in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return ids


def truncate_at_stop(text: str, stop: list[str]) -> str | None:
    """The text before the first stop string, or None when none occurs."""
    cuts = [text.index(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else None


class TransformersEngine:
    """Batched sampling from a PEFT model with transformers, on CPU or GPU."""

    def __init__(self, model: Any, tokenizer: Any, config: ModelConfig, *, step: int = 0) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.step = step
        self.device = next(model.parameters()).device
        self._stop_ids = stop_token_ids(model, tokenizer)
        self.longest_token_bytes = max((len(t.encode()) for t in tokenizer.get_vocab()), default=1)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self._stop_ids, default=0)
        # transformers 5.2x renamed `past_key_values` to `cache` (argument and output); use what this model takes
        forward = inspect.signature(model.get_base_model().forward).parameters
        self._cache_kw = "cache" if "cache" in forward else "past_key_values"
        self._pending: collections.deque[_Request] = collections.deque()
        self._wakeup = asyncio.Event()
        self._gate = asyncio.Lock()  # held by a running batch or by training
        self._worker: asyncio.Task[None] | None = None
        self._older: collections.OrderedDict[int, str] = collections.OrderedDict()  # step -> loaded adapter name

    @classmethod
    def load(cls, base_model: str, config: ModelConfig) -> TransformersEngine:
        model, tokenizer = load_peft_model(base_model, config)
        return cls(model, tokenizer, config)

    def load_adapter(self, path: str | Path) -> None:
        """Load a checkpoint's adapter weights into the served adapter (restart, rollback)."""
        from peft import load_peft_weights, set_peft_model_state_dict

        weights = load_peft_weights(str(path), device=str(self.device))
        result = set_peft_model_state_dict(self.model, weights, adapter_name="default")
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if unexpected:
            raise ValueError(
                f"checkpoint {path} does not match this model's LoRA config: unexpected keys {unexpected[:3]}"
            )
        self.model.eval()

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Hold generation (the running batch finishes first); queued requests wait until exit."""
        async with self._gate:
            yield

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_token: TokenCallback | None = None,
        older: OlderStep | None = None,
        cancel: threading.Event | None = None,
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
        self._pending.append(_Request(list(prompt_ids), params, future, on_token, older, cancel))
        self._wakeup.set()
        return await future

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None

    async def _run(self) -> None:
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await asyncio.sleep(0)  # let requests made in the same tick join this batch
            batch = self._next_batch()
            async with self._gate:
                for request, outcome in zip(batch, await self._isolated(batch), strict=True):
                    if request.future.done():
                        continue
                    if isinstance(outcome, Exception):
                        request.future.set_exception(outcome)
                    else:
                        request.future.set_result(outcome)
            if not self._pending:
                trim_heap()

    async def _isolated(self, batch: list[_Request]) -> list[list[Sample] | Exception]:
        """Each request's samples, or the error it caused: a batch that fails is retried one request at
        a time, so one bad request fails alone instead of taking the others down with it (a streamed
        request that already sent tokens cannot start over, and fails with the batch)."""
        try:
            return list(await asyncio.to_thread(self._generate_for, batch))
        except Exception as exc:
            if len(batch) == 1:
                return [exc]
            failure = exc
        outcomes: list[list[Sample] | Exception] = []
        for request in batch:
            if request.streamed:
                outcomes.append(failure)
                continue
            try:
                outcomes.append((await asyncio.to_thread(self._generate_for, [request]))[0])
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    def _next_batch(self) -> list[_Request]:
        """The oldest request and those queued after it for the same checkpoint, up to max_batch_size rows."""
        wanted = self._pending[0].older
        batch: list[_Request] = []
        rows = 0
        for request in list(self._pending):
            if request.older != wanted:
                continue
            if batch and rows + request.params.n > self.config.max_batch_size:
                break
            batch.append(request)
            rows += request.params.n
            self._pending.remove(request)
        return batch

    def _generate_for(self, batch: list[_Request]) -> list[list[Sample]]:
        """`_generate_batch` with the batch's checkpoint active: the latest, or an older one loaded beside it."""
        older = batch[0].older
        if older is None or older.step == self.step:
            return self._generate_batch(batch)
        self.model.set_adapter(self._older_adapter(older))
        try:
            grouped = self._generate_batch(batch)
        finally:
            self.model.set_adapter("default")  # also makes only "default" trainable again
        for samples in grouped:
            for sample in samples:
                sample.step = older.step
        return grouped

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

    def _generate_batch(self, batch: list[_Request]) -> list[list[Sample]]:
        """Sample every choice of every request in one decoding loop (runs in a worker thread)."""
        import torch

        rows = [(request, index) for request in batch for index in range(request.params.n)]
        step = self.step
        generators = []
        for request, index in rows:
            generator = torch.Generator(device=self.device)
            if request.params.seed is not None:
                generator.manual_seed(request.params.seed + index)
            else:
                generator.seed()
            generators.append(generator)
        width = max(len(r.prompt_ids) for r, _ in rows)
        input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (request, _) in enumerate(rows):
            input_ids[i, width - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            attention[i, width - len(request.prompt_ids) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        temperature = torch.tensor([[r.params.temperature] for r, _ in rows], device=self.device)
        top_p = torch.tensor([[r.params.top_p] for r, _ in rows], device=self.device)
        basis = torch.tensor([[r.params.logprob_temperature] for r, _ in rows], device=self.device)
        budget = [r.params.max_tokens for r, _ in rows]
        decoders = [IncrementalDecoder(self.tokenizer) if r.params.stop else None for r, _ in rows]
        out_ids: list[list[int]] = [[] for _ in rows]
        out_lp: list[list[float]] = [[] for _ in rows]
        finish: list[str | None] = [None] * len(rows)
        texts: list[str | None] = [None] * len(rows)
        past = None
        step_input = input_ids
        with torch.inference_mode():
            while any(f is None for f in finish):
                output = self.model(
                    input_ids=step_input,
                    attention_mask=attention,
                    position_ids=positions,
                    use_cache=True,
                    logits_to_keep=1,
                    **{self._cache_kw: past},
                )
                past = getattr(output, self._cache_kw)
                logits = output.logits[:, -1, :].float()
                logprobs = torch.log_softmax(logits / basis, dim=-1)
                chosen = self._sample(logits, temperature, top_p, generators)
                for i, token in enumerate(chosen):
                    if finish[i] is not None:
                        continue
                    cancel = rows[i][0].cancel
                    if cancel is not None and cancel.is_set():
                        finish[i], texts[i] = "cancelled", self._decode(out_ids[i])
                        continue
                    out_ids[i].append(token)
                    out_lp[i].append(float(logprobs[i, token]))
                    request, choice = rows[i]
                    if request.on_token is not None:
                        request.streamed = True
                        request.on_token(choice, token)
                    finish[i], texts[i] = self._check_finish(token, out_ids[i], request.params, budget[i], decoders[i])
                step_input = torch.tensor([[t] for t in chosen], device=self.device)
                attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
                positions = positions[:, -1:] + 1
        samples = [
            Sample(
                token_ids=ids,
                logprobs=lps,
                text=text or "",
                finish_reason=reason,  # type: ignore[arg-type]
                step=step,
                temperature=request.params.logprob_temperature,
            )
            for ids, lps, text, reason, (request, _) in zip(out_ids, out_lp, texts, finish, rows, strict=True)
        ]
        grouped, start = [], 0
        for request in batch:
            grouped.append(samples[start : start + request.params.n])
            start += request.params.n
        return grouped

    @staticmethod
    def _sample(logits: Any, temperature: Any, top_p: Any, generators: list[Any]) -> list[int]:
        import torch

        greedy = logits.argmax(dim=-1)
        scaled = logits / temperature.clamp(min=1e-5)
        probs = torch.softmax(scaled, dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        outside = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p  # keeps at least the top token
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        chosen = []
        for i, generator in enumerate(generators):
            if float(temperature[i, 0]) <= 0.0:
                chosen.append(int(greedy[i]))
                continue
            pick = torch.multinomial(sorted_probs[i], 1, generator=generator)
            chosen.append(int(order[i, pick]))
        return chosen

    def _check_finish(
        self, token: int, ids: list[int], params: SamplingParams, budget: int, text: IncrementalDecoder | None
    ) -> tuple[str | None, str | None]:
        """(finish_reason, text) once the row is done, else (None, None); `text` follows rows with stop strings."""
        if token in self._stop_ids:
            return "stop", self._decode(ids[:-1])
        if text is not None and text.push(token):
            cut = truncate_at_stop(text.text, params.stop)
            if cut is not None:
                return "stop", cut
        if len(ids) >= budget:
            return "length", self._decode(ids)
        return None, None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

"""Serving overhead: the art-agents server (HTTP + OpenAI SDK + engine + token store) vs decoding by hand.

One process, one model, one thread setting: the server runs under uvicorn in a thread and the
baselines run on their own copy of the same weights (the same fresh LoRA) in the main thread. Every
side samples at temperature 1 (no top-k, no top-p) exactly `--max-tokens` tokens per row: both load a
copy of the model saved without an end-of-sequence token, so no row stops early and every side does
the same decoding work. Scenarios, each side run in turn per round (interleaved), after a warm-up round:

  concurrent  8 prompts as 8 concurrent requests to the server (`AsyncOpenAI`), vs the same 8 prompts
              decoded together, left-padded: by `model.generate` and by a bare KV-cache loop; and the engine
              with its prefix cache off, since unrelated prompts gain nothing from it (goal: on <= 1.05x off)
  n=8         one request with n=8 on one prompt, vs one prefill, its cache repeated to 8 rows, and an
              8-row bare decode
  sequential  2 prompts one request at a time, vs the bare loop one prompt at a time

In the first two, the engine is also called in-process on the baselines' weights (no HTTP, SDK,
chat template or token store), which splits the server's overhead into the engine's and the rest.

Figures are ms per generated token (median and min-max over rounds) and the per-round ratio of the
server to the bare loop. Targets: concurrent <= 1.3x, n=8 <= 1.2x.

    python benchmarks/serving_overhead.py [--smollm2] [--rounds 5] [--prompts 8] [--max-tokens 32] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path: finds timing.py
from bench_setup import add_model_arguments, endless_model, in_process_server, register_model
from timing import Summary, interleaved, ratio

PROMPTS = [
    "What is 2 + 2?",
    "Name a colour.",
    "Say hello to the user.",
    "What is the capital of France?",
    "Write one word about the sea.",
    "Count to three.",
    "Is water wet?",
    "Describe a cat in five words.",
]
SEQUENTIAL_PROMPTS = 2
TARGETS = {"concurrent": 1.3, "n=8": 1.2}
# A decoding step of `--prompts` rows against one request's step (issue 43): batching must stay cheap per row.
BATCHING_GOALS = {"concurrent": 2.0, "n=8": 1.6}


class Baselines:
    """The same LoRA model decoded without the server: `model.generate` and a bare KV-cache loop."""

    def __init__(self, model_path: str, messages: list[list[dict[str, str]]], max_tokens: int) -> None:
        from art_agents.server.models.chat_format import render_prompt_ids
        from art_agents.server.models.lora_model import load_peft_model
        from art_agents.train_config import ModelConfig

        self.model, self.tokenizer = load_peft_model(model_path, ModelConfig())
        self.max_tokens = max_tokens
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.prompts = [render_prompt_ids(self.tokenizer, m, None) for m in messages]
        # transformers 5.2x renamed `past_key_values` to `cache` (argument and output), as the engine handles
        forward = inspect.signature(self.model.get_base_model().forward).parameters
        self.cache_kw = "cache" if "cache" in forward else "past_key_values"

    def left_padded(self, prompts: list[list[int]]) -> tuple[Any, Any]:
        import torch

        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        return ids, mask

    def generate(self, prompts: list[list[int]]) -> None:
        import torch

        ids, mask = self.left_padded(prompts)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                max_new_tokens=self.max_tokens, pad_token_id=self.pad_id, eos_token_id=None,
            )  # fmt: skip
        _check_length(out.shape[1] - ids.shape[1], self.max_tokens, "model.generate")

    def bare(self, prompts: list[list[int]], copies: int = 1) -> None:
        """Prefill `prompts` (left-padded), repeat each row's cache `copies` times, then decode every row."""
        import torch

        ids, attention = self.left_padded(prompts)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = None
        with torch.inference_mode():
            for step in range(self.max_tokens):
                output = self.model(
                    input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True,
                    logits_to_keep=1, **{self.cache_kw: cache},
                )  # fmt: skip
                cache = getattr(output, self.cache_kw)
                logits = output.logits[:, -1].float()
                if step == 0 and copies > 1:
                    cache.batch_repeat_interleave(copies)
                    logits = logits.repeat_interleave(copies, dim=0)
                    attention = attention.repeat_interleave(copies, dim=0)
                    positions = positions.repeat_interleave(copies, dim=0)
                ids = torch.multinomial(torch.softmax(logits, dim=-1), 1)
                attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
                positions = positions[:, -1:] + 1

    def bare_each(self, prompts: list[list[int]]) -> None:
        for prompt in prompts:
            self.bare([prompt])


class EngineSide:
    """The server's engine called in-process (no HTTP, SDK, templating or token store) on the same weights:
    splits the server's overhead into the engine's and the request path's."""

    def __init__(self, model: Any, tokenizer: Any, max_tokens: int, config: Any) -> None:
        from art_agents.server.engines.transformers_engine import TransformersEngine

        self.engine = TransformersEngine(model, tokenizer, config)
        self.loop = asyncio.new_event_loop()
        self.max_tokens = max_tokens

    def run(self, prompts: list[list[int]], n: int = 1) -> None:
        from art_agents.server.engines.protocol import SamplingParams

        params = SamplingParams(max_tokens=self.max_tokens, temperature=1.0, n=n)

        async def together() -> list[Any]:
            return await asyncio.gather(*(self.engine.generate(p, params) for p in prompts))

        for samples in self.loop.run_until_complete(together()):
            for sample in samples:
                _check_length(len(sample.token_ids), self.max_tokens, "the engine")

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.close())
        self.loop.close()


def _check_length(generated: int, wanted: int, side: str) -> None:
    if generated != wanted:
        raise RuntimeError(f"{side} generated {generated} tokens per row, not {wanted}: the comparison is off")


class ServerClient:
    """OpenAI SDK calls to the served model, on one event loop kept for the whole run."""

    def __init__(self, url: str, messages: list[list[dict[str, str]]], max_tokens: int) -> None:
        import openai

        self.loop = asyncio.new_event_loop()
        self.client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        self.messages = messages
        self.max_tokens = max_tokens

    async def _one(self, messages: list[dict[str, str]], n: int = 1) -> None:
        response = await self.client.chat.completions.create(
            model="bench",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=self.max_tokens,
            temperature=1.0,
            n=n,
        )
        assert response.usage is not None
        _check_length(response.usage.completion_tokens // n, self.max_tokens, "the server")

    def concurrent(self) -> None:
        async def run() -> None:
            await asyncio.gather(*(self._one(m) for m in self.messages))

        self.loop.run_until_complete(run())

    def sequential(self, count: int) -> None:
        for m in self.messages[:count]:
            self.loop.run_until_complete(self._one(m))

    def n_choices(self, n: int) -> None:
        self.loop.run_until_complete(self._one(self.messages[0], n))

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


def measure(url: str, model_path: str, args: argparse.Namespace) -> dict[str, dict[str, Summary]]:
    """Per scenario, each side's seconds per generated token, measured interleaved."""

    from art_agents.train_config import ModelConfig

    register_model(url, model_path)
    messages = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(args.prompts)]
    server = ServerClient(url, messages, args.max_tokens)
    base = Baselines(model_path, messages, args.max_tokens)
    engine = EngineSide(base.model, base.tokenizer, args.max_tokens, ModelConfig())
    uncached = EngineSide(base.model, base.tokenizer, args.max_tokens, ModelConfig(prefix_cache_mb=0))
    first, sequential = base.prompts[:1], min(SEQUENTIAL_PROMPTS, args.prompts)
    scenarios: dict[str, tuple[int, dict[str, Callable[[], float | None]]]] = {
        "concurrent": (
            args.prompts,
            {
                "server": server.concurrent,
                "engine": lambda: engine.run(base.prompts),
                "uncached": lambda: uncached.run(base.prompts),
                "generate": lambda: base.generate(base.prompts),
                "bare": lambda: base.bare(base.prompts),
            },
        ),
        "n=8": (
            8,
            {
                "server": lambda: server.n_choices(8),
                "engine": lambda: engine.run(first, n=8),
                "bare": lambda: base.bare(first, copies=8),
            },
        ),
        "sequential": (
            sequential,
            {
                "server": lambda: server.sequential(sequential),
                "bare": lambda: base.bare_each(base.prompts[:sequential]),
            },
        ),
    }
    sides = {f"{scenario}/{side}": run for scenario, (_, runs) in scenarios.items() for side, run in runs.items()}
    try:
        times = interleaved(sides, rounds=args.rounds)
    finally:
        server.close()
        engine.close()
        uncached.close()
    return {
        scenario: {side: times[f"{scenario}/{side}"].scaled(1 / (rows * args.max_tokens)) for side in runs}
        for scenario, (rows, runs) in scenarios.items()
    }


def report(results: dict[str, dict[str, Summary]], prompts: int) -> None:
    labels = {
        "server": "server (OpenAI SDK)",
        "engine": "engine, no HTTP",
        "uncached": "... no prefix cache",
        "generate": "model.generate",
        "bare": "bare KV-cache loop",
    }
    print(f"\n{'scenario':<11} {'side':<20} {'ms per generated token':<32} {'server / this side'}")
    for scenario, sides in results.items():
        for side, summary in sides.items():
            vs = "" if side == "server" else ratio(sides["server"], summary).format("x", 1, 2)
            print(f"{scenario:<11} {labels[side]:<20} {summary.format('ms', 1000, 2):<32} {vs}")
    parts = []
    for scenario, sides in results.items():
        r = ratio(sides["server"], sides["bare"])
        target = TARGETS.get(scenario)
        verdict = f" [target <= {target}x: {'met' if r.median <= target else 'missed'}]" if target else ""
        parts.append(f"{scenario} {r.format('x', 1, 2)}{verdict}")
        if "generate" in sides:
            parts.append(f"{scenario} vs generate {ratio(sides['server'], sides['generate']).format('x', 1, 2)}")
        if "engine" in sides:
            parts.append(f"{scenario} engine alone {ratio(sides['engine'], sides['bare']).format('x', 1, 2)}")
        if "uncached" in sides:
            share = ratio(sides["engine"], sides["uncached"])
            parts.append(f"{scenario} prefix cache on / off {share.format('x', 1, 2)} [goal <= 1.05x]")
    print("\nsummary (server / bare loop, per token): " + "; ".join(parts))
    batching = []
    for scenario, goal in BATCHING_GOALS.items():
        for side in ("server", "bare"):
            rows = ratio(results[scenario][side].scaled(prompts), results["sequential"][side])
            verdict = f" [goal <= {goal}x: {'met' if rows.median <= goal else 'missed'}]" if side == "server" else ""
            batching.append(f"{scenario} {side} {rows.format('x', 1, 2)}{verdict}")
    print(f"batching ({prompts} rows' decoding time / one request's, per step): " + "; ".join(batching))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--prompts", type=int, default=8, help="concurrent requests (rows of the batched baselines)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens generated per row, on every side")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds, after one warm-up round")
    parser.add_argument("--threads", type=int, help="torch CPU threads for every side (default: torch's)")
    args = parser.parse_args()

    # the OpenMP spin setting a served model runs with, which must be set before torch loads
    import art_agents.server  # noqa: F401

    # isort: split
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="art-serving-") as tmp:
        folder = Path(tmp)
        model_path, label = endless_model(args, folder)
        print(
            f"model {label}; {args.prompts} prompts x {args.max_tokens} "
            f"tokens, temperature 1; {args.rounds} rounds; torch threads {torch.get_num_threads()}"
        )
        with in_process_server(folder / "art") as url:
            results = measure(url, model_path, args)
    report(results, args.prompts)


if __name__ == "__main__":
    main()

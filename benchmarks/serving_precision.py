"""Serving from bf16 or int8 weights (`ModelConfig.serving_dtype`) vs fp32: the server's own time per token.

The real server in a thread of this process serves the same model three times, once per precision (saved without
an end-of-sequence token, so every call decodes exactly `--max-tokens` tokens), and each side sends `n` chat calls
at once for n in `--concurrent` (1, 4 and 8 by default), every side once per round (interleaved) after a warm-up
round. Figures are milliseconds per token of one call (the round's wall time over `--max-tokens`: at n at once,
every call's tokens arrive in that time), median and min-max, and the per-round ratio to fp32. Goal: <= 0.5x fp32
at 8 at once.

    python benchmarks/serving_precision.py [--smollm2] [--rounds 7] [--max-tokens 32] [--concurrent 1 4 8]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path: finds timing.py
from bench_setup import measure_served, register_model, serving_parser
from timing import Summary, interleaved, ratio

PRECISIONS = ("float32", "bfloat16", "int8")
PROMPT = "Write a short story about a lighthouse keeper."
GOAL = 0.5


def side(url: str, precision: str, concurrent: int, max_tokens: int, loop: asyncio.AbstractEventLoop) -> Callable:
    """One round of a side: `concurrent` calls at once to the model served in `precision`, checked for length."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    async def call() -> int:
        reply = await client.chat.completions.create(
            model=precision, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens, temperature=1.0
        )
        return reply.usage.completion_tokens  # type: ignore[union-attr]

    async def run() -> None:
        counts = await asyncio.gather(*(call() for _ in range(concurrent)))
        if any(count != max_tokens for count in counts):
            raise RuntimeError(f"a call decoded {counts} tokens, not {max_tokens}: the sides would differ")

    return lambda: loop.run_until_complete(run())


def measure(url: str, model_path: str, args: argparse.Namespace) -> dict[int, dict[str, Summary]]:
    for precision in PRECISIONS:
        register_model(url, model_path, name=precision, config={"serving_dtype": precision})
    loop = asyncio.new_event_loop()
    try:
        return {
            n: {
                precision: summary.scaled(1 / args.max_tokens)
                for precision, summary in interleaved(
                    {p: side(url, p, n, args.max_tokens, loop) for p in PRECISIONS}, args.rounds
                ).items()
            }
            for n in args.concurrent
        }
    finally:
        loop.close()


def report(results: dict[int, dict[str, Summary]]) -> None:
    for concurrent, sides in results.items():
        print(f"\n{concurrent} at once: ms per token (median, min-max); ratio to float32 per round")
        for precision, summary in sides.items():
            line = f"  {precision:<9} {summary.format('ms', 1000, 1)}"
            if precision != "float32":
                versus = ratio(summary, sides["float32"])
                line += f"   {versus.format('x', 1, 2)}"
                if concurrent == 8:
                    line += f"  {'meets' if versus.median <= GOAL else 'misses'} <= {GOAL}x"
            print(line)


def main() -> None:
    parser = serving_parser(__doc__)
    parser.add_argument("--concurrent", type=int, nargs="+", default=[1, 4, 8], help="calls at once, per scenario")
    report(measure_served(parser.parse_args(), measure))


if __name__ == "__main__":
    main()

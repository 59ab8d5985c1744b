"""The first requests after `register`, on a quiet machine and a busy one: does serving run at speed at once?

Each run starts the server as users do (`LocalBackend`, a process of its own), registers the model, and sends
`--batches` batches of `--prompts` concurrent chat requests (`--max-tokens` tokens each, temperature 1). Two sides,
interleaved run by run:

  shipped   the server as shipped: libgomp's threads spin 1,000 pauses at a barrier, then sleep
            (server/host/cpu_threads.py)
  spinning  libgomp's own default (GOMP_SPINCOUNT=300000), what the server ran with before
  passive   OMP_WAIT_POLICY=PASSIVE: no spinning at all

and two conditions: quiet, and busy with `--busy` processes spinning on the CPU beside it (what a rollout client,
an MCP server or another job does to a shared machine). Figures are per-batch seconds, median and range over runs;
`first / third` is each run's first batch over its third (goal <= 1.3x), and `<side> / shipped` compares the
sides' batch times run by run.

    python benchmarks/first_requests.py [--tiny] [--runs 3] [--busy 2] [--batches 3] [--prompts 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by path: finds timing.py
from timing import Summary, ratio

PROMPTS = ["What is 2 + 2?", "Name a colour.", "Say hello to the user.", "What is the capital of France?"]
# The OpenMP settings the server process starts with (None: unset, so the server chooses).
SIDES: dict[str, dict[str, str | None]] = {
    "shipped": {"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": None},
    "spinning": {"GOMP_SPINCOUNT": "300000", "OMP_WAIT_POLICY": None},
    "passive": {"GOMP_SPINCOUNT": "0", "OMP_WAIT_POLICY": "PASSIVE"},
}
GOAL_FIRST_OVER_THIRD = 1.3


@contextmanager
def busy(processes: int) -> Iterator[None]:
    """`processes` Python processes spinning on the CPU until the block ends."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    """`values` set in (None: removed from) os.environ, which the server process inherits, for the block."""
    saved = {name: os.environ.get(name) for name in values}

    def apply(settings: dict[str, str | None]) -> None:
        for name, value in settings.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    apply(values)
    try:
        yield
    finally:
        apply(saved)


async def one_run(art_path: Path, base_model: str, gguf_file: str | None, args: argparse.Namespace) -> list[float]:
    """Register the model on a fresh server; the seconds of each batch of concurrent requests."""
    import art_agents as art

    backend = art.LocalBackend(art_path)
    try:
        model = art.TrainableModel(
            name="first", project="bench", base_model=base_model, config=art.ModelConfig(gguf_file=gguf_file)
        )
        await model.register(backend)
        client = model.openai_client()

        async def ask(prompt: str) -> None:
            await client.chat.completions.create(
                model=model.name,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=args.max_tokens,
                temperature=1.0,
            )

        seconds = []
        for _ in range(args.batches):
            started = time.perf_counter()
            await asyncio.gather(*(ask(PROMPTS[i % len(PROMPTS)]) for i in range(args.prompts)))
            seconds.append(time.perf_counter() - started)
        return seconds
    finally:
        await backend.close()


def measure(base_model: str, gguf_file: str | None, args: argparse.Namespace, work: Path) -> dict:
    """{condition: {side: [per-run batch seconds]}}, the sides alternating which goes first run by run."""
    results: dict[str, dict[str, list[list[float]]]] = {}
    for condition, spinners in (("quiet", 0), ("busy", args.busy)):
        results[condition] = {side: [] for side in SIDES}
        for run in range(args.runs):
            order = list(SIDES)[run % len(SIDES) :] + list(SIDES)[: run % len(SIDES)]  # each side leads in turn
            for side in order:
                with environment(SIDES[side]), busy(spinners):
                    art_path = work / f"{condition}-{side}-{run}"
                    seconds = asyncio.run(one_run(art_path, base_model, gguf_file, args))
                results[condition][side].append(seconds)
                shown = " ".join(f"{s:.2f}" for s in seconds)
                print(f"{condition} {side} run {run + 1}: batches {shown} s", flush=True)
    return results


def report(results: dict, batches: int) -> None:
    third = min(3, batches) - 1
    for condition, sides in results.items():
        firsts = {side: Summary.of([r[0] for r in runs]) for side, runs in sides.items()}
        thirds = {side: Summary.of([r[third] for r in runs]) for side, runs in sides.items()}
        totals = {side: Summary.of([sum(r) for r in runs]) for side, runs in sides.items()}
        for side in sides:
            share = ratio(firsts[side], thirds[side])
            met = "met" if share.median <= GOAL_FIRST_OVER_THIRD else "missed"
            print(
                f"{condition} {side}: first batch {firsts[side].format('s', 1, 2)}, batch {third + 1} "
                f"{thirds[side].format('s', 1, 2)}; first / batch {third + 1} {share.format('x', 1, 2)} "
                f"[goal <= {GOAL_FIRST_OVER_THIRD}x: {met}]"
            )
        shown = [f"{side} / shipped {ratio(totals[side], totals['shipped']).format('x', 1, 2)}" for side in SIDES]
        print(f"summary {condition}, all batches of a run: " + "; ".join(shown[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="the random tiny test model (checks the script)")
    parser.add_argument("--runs", type=int, default=3, help="runs per side and condition, interleaved")
    parser.add_argument("--busy", type=int, default=2, help="CPU-spinning processes beside the busy condition")
    parser.add_argument("--batches", type=int, default=3, help="batches of concurrent requests per run")
    parser.add_argument("--prompts", type=int, default=4, help="concurrent requests per batch")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="art-first-") as tmp:
        work = Path(tmp)
        from bench_setup import bench_model

        base_model, gguf_file = bench_model(args.tiny, work / "tiny")
        print(
            f"model {base_model}{' / ' + gguf_file if gguf_file else ''}; {args.batches} batches of {args.prompts} "
            f"requests x {args.max_tokens} tokens; {args.runs} runs per side; busy: {args.busy} spinning processes; "
            f"{os.cpu_count()} CPUs",
            flush=True,
        )
        results = measure(base_model, gguf_file, args, work)
    report(results, args.batches)


if __name__ == "__main__":
    main()

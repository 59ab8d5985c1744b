"""The task both scripts train on, and the run around their rollout: train, then a held-out evaluation.

A question asks for the sum of two numbers; the agent has an `add` tool and is rewarded when its final
answer holds the sum (with partial credit for its digits). The rollout is all that differs between the SDKs: each script passes its own.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import art_agents as art

PROJECT = "any-agent"
SYSTEM = "You answer arithmetic questions. Use the add tool, then give the result as a number."
Rollout = Callable[[art.Model, dict[str, Any]], Awaitable[art.Trajectory]]


def questions(first_seed: int, count: int, exclude: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """`count` questions from consecutive seeds, none of them in `exclude` (the held-out ones skip the training ones)."""
    seen = {q["question"] for q in exclude}
    out: list[dict[str, Any]] = []
    seed = first_seed
    while len(out) < count:
        rng = random.Random(seed)
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        question = f"What is {a} + {b}?"
        if question not in seen:
            seen.add(question)
            out.append({"id": f"q{seed}", "question": question, "answer": a + b})
        seed += 1
    return out


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def reward(answer: str | None, scenario: dict[str, Any]) -> float:
    """1 for the sum; otherwise a little for each of its digits the answer holds, so early attempts differ."""
    expected, answer = str(scenario["answer"]), answer or ""
    if expected in answer:
        return 1.0
    return 0.25 * sum(digit in answer for digit in expected) / len(expected)


def build_model(args: argparse.Namespace, name: str) -> art.TrainableModel:
    base_model = args.base_model
    if args.tiny:  # the random tiny model, built once into the run folder: runs anywhere, learns nothing
        from art_agents.server.ops.tiny_model import build_tiny_model

        folder = args.art_path / PROJECT / "tiny-model"
        base_model = str((folder if (folder / "config.json").exists() else build_tiny_model(folder)).resolve())
    config = art.ModelConfig(default_max_tokens=32 if args.tiny else 256)
    return art.TrainableModel(
        name=f"tiny-{name}" if args.tiny else name, project=PROJECT, base_model=base_model, config=config
    )


async def run(rollout: Rollout, name: str, args: argparse.Namespace) -> art.Evaluation:
    model = build_model(args, name)
    backend = art.LocalBackend(args.art_path)
    try:
        await model.register(backend)
        training = questions(0, 64)
        await art.train_loop(
            model, rollout, training, steps=args.steps, groups_per_step=args.groups, rollouts_per_group=4
        )
        held_out = questions(10_000, args.held_out, exclude=training)
        evaluation = await art.evaluate(rollout, held_out, models=[f"{model.name}@0", model], steps_of=model)
    finally:
        await backend.close()
    for summary in evaluation.summary.models:
        print(f"{summary.model}: held-out reward {summary.mean_reward:.3f} over {summary.scenarios} questions")
    for pair in evaluation.summary.comparisons:
        print(f"{pair.model} - {pair.baseline}: {pair.mean_difference:+.3f} [{pair.ci_low:+.3f}, {pair.ci_high:+.3f}]")
    return evaluation


def main(rollout: Rollout, name: str, description: str) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tiny", action="store_true", help="the random tiny model with small settings (CI)")
    parser.add_argument("--base-model", default="Qwen/Qwen3-0.6B", help="hub id or folder (ignored with --tiny)")
    parser.add_argument("--art-path", type=Path, default=Path(".art"), help="the server's folder")
    parser.add_argument("--steps", type=int, help="training steps (default: 20; 1 with --tiny)")
    parser.add_argument("--groups", type=int, help="questions per step (default: 8; 2 with --tiny)")
    parser.add_argument("--held-out", type=int, help="held-out questions (default: 40; 4 with --tiny)")
    args = parser.parse_args()
    tiny = args.tiny
    args.steps = args.steps or (1 if tiny else 20)
    args.groups = args.groups or (2 if tiny else 8)
    args.held_out = args.held_out or (4 if tiny else 40)
    asyncio.run(run(rollout, name, args))

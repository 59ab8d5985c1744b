"""Teach a chat model to solve generated who-did-it logic puzzles with GRPO, and measure it on held-out puzzles.

A one-turn task with a checkable answer, in the style of ART's Temporal Clue: `generator.py` builds a puzzle from a
seed (3 or 4 suspects, weapons, rooms and hours, and a minimal set of clues that leaves exactly one solution); the
model reasons and ends with `ANSWER: <suspect>, <weapon>, <room>`; `reward.py` reads that last line strictly (a
third per correct field, 0 for a missing or malformed line, so hedging and echoing the clues earn nothing).

Rollouts are plain OpenAI SDK calls inside `art_agents.rollout()`; `art_agents.train_loop` draws fresh puzzles for
every step (training seeds 0, 1, 2, ...), runs a group of attempts at each and trains. Puzzles from seeds training
never reaches are solved greedily before and after training and logged with `model.log(groups, split="val")`, so
`history.jsonl` and `art-agents report` show the held-out rates.

    python examples/logic_puzzles/train.py --tiny                          # CPU: the random tiny model, ~20 s
    python examples/logic_puzzles/train.py --base-model Qwen/Qwen3-0.6B    # a GPU and a real model
"""

from __future__ import annotations

from art_agents.extras import exit_unless_installed

exit_unless_installed("examples/logic_puzzles/train.py", "server")  # before any import of them

import argparse
import asyncio
import dataclasses
import functools
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from generator import Puzzle, generate_puzzle
from reward import PREFIX, score

import art_agents as art

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

PROJECT = "logic-puzzles"
HELD_OUT_FIRST_SEED = 1_000_000_000  # training draws seeds 0, 1, 2, ... and never gets this far
FIELDS = ("suspect", "weapon", "room")
RATES = ("exact", *FIELDS, "well_formed")

SYSTEM_PROMPT = (
    "You solve logic puzzles. Reason step by step from the clues, then end your reply with exactly one line of the "
    f"form\n{PREFIX} <suspect>, <weapon>, <room>\nusing the names as the puzzle writes them. Only that last line is "
    f"read: one name per field, and no other line starting with {PREFIX}"
)


@dataclasses.dataclass(frozen=True)
class Mode:
    """The settings that differ between a real run and the tiny CPU check (`--tiny`)."""

    steps: int
    puzzles_per_step: int
    group_size: int
    val_puzzles: int
    max_tokens: int
    lora_rank: int
    references_per_group: int


REAL = Mode(
    steps=40,
    puzzles_per_step=8,
    group_size=8,
    val_puzzles=64,
    max_tokens=1024,
    lora_rank=16,
    references_per_group=0,
)
# A random model never writes an answer line, so its groups score all 0 and GRPO has nothing to compare: each
# group gets the generator's own answer as one more attempt (the same reward scores it), so the steps train.
TINY = Mode(
    steps=2,
    puzzles_per_step=2,
    group_size=4,
    val_puzzles=4,
    max_tokens=16,
    lora_rank=4,
    references_per_group=1,
)


@dataclasses.dataclass(frozen=True)
class Sampling:
    system_prompt: str
    temperature: float
    max_tokens: int


class FreshPuzzles:
    """A `train_loop` scenario source: draw `d` takes the next `count` training seeds, so no puzzle repeats."""

    def pick(self, draw: int, count: int) -> list[Puzzle]:
        return [generate_puzzle(draw * count + i) for i in range(count)]


def system_prompt(base_model: str) -> str:
    """Qwen3 thinks at length in a hidden block unless told `/no_think`; here the reasoning is the reply itself."""
    return SYSTEM_PROMPT + (" /no_think" if "qwen3" in base_model.lower() else "")


def conversation(puzzle: Puzzle, sampling: Sampling) -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": sampling.system_prompt}, {"role": "user", "content": puzzle.text()}]


def record_score(trajectory: art.Trajectory, reply: str, puzzle: Puzzle) -> None:
    """The reward, and each part of it as a metric (`model.log` averages them into the `val/...` columns)."""
    result = score(reply, puzzle.options, puzzle.answer)
    trajectory.reward = result.reward
    trajectory.metrics.update(exact=float(result.exact), well_formed=float(result.well_formed))
    trajectory.metrics.update({field: float(ok) for field, ok in zip(FIELDS, result.fields_correct, strict=True)})


async def solve(model: art.TrainableModel, puzzle: Puzzle, *, sampling: Sampling) -> art.Trajectory:
    """One attempt: the puzzle in, one reply out, scored from its last line."""
    async with (
        model.openai_client() as client,
        art.rollout(puzzle_seed=puzzle.seed, answer=", ".join(puzzle.answer)) as trajectory,
    ):
        response = await client.chat.completions.create(
            model=model.name,
            messages=conversation(puzzle, sampling),
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
        )
        record_score(trajectory, response.choices[0].message.content or "", puzzle)
    return trajectory


def reference(puzzle: Puzzle, sampling: Sampling) -> art.Trajectory:
    """The generator's answer as an attempt. RL trains only a trajectory's `turns`: this one names the reply
    (message 2) without a completion id, so the server trains on it re-tokenized (`turns_retokenized`)."""
    reply = f"{PREFIX} {', '.join(puzzle.answer)}"
    trajectory = art.Trajectory(
        messages=[*conversation(puzzle, sampling), {"role": "assistant", "content": reply}],
        turns=[art.Turn(index=2)],
        metadata={"puzzle_seed": puzzle.seed, "answer": ", ".join(puzzle.answer), "reference": True},
    )
    record_score(trajectory, reply, puzzle)
    return trajectory


async def add_references(group: art.TrajectoryGroup, *, count: int, sampling: Sampling) -> art.TrajectoryGroup:
    """`after_each` for `train_loop`: `count` reference answers join the group of attempts at the same puzzle."""
    if group.trajectories:
        puzzle = generate_puzzle(group.trajectories[0].metadata["puzzle_seed"])
        group.trajectories.extend(reference(puzzle, sampling) for _ in range(count))
    return group


def rates(groups: list[art.TrajectoryGroup]) -> dict[str, float]:
    """The share of replies exactly right, right per field and well formed."""
    replies = [t for g in groups for t in g.trajectories]
    return {name: statistics.fmean(t.metrics[name] for t in replies) for name in RATES}


async def evaluate(model: art.TrainableModel, held_out: list[Puzzle], sampling: Sampling) -> dict[str, float]:
    """One greedy reply per held-out puzzle, logged as the `val` split at the served step."""
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup([solve(model, puzzle, sampling=sampling)]) for puzzle in held_out),
        pbar_desc="held-out puzzles",
        max_exceptions=0,
    )
    result = await model.log(groups, split="val")
    values = rates(groups)
    print(f"step {result.step}: held-out  " + "  ".join(f"{k} {v:.3f}" for k, v in values.items()), flush=True)
    return values


def build_model(args: argparse.Namespace, mode: Mode) -> art.TrainableModel:
    """The trainable LoRA; with `--tiny`, on the random tiny model built into the run folder (once)."""
    base_model = args.base_model
    if args.tiny:
        from art_agents.server.ops.tiny_model import build_tiny_model

        folder = args.art_path / PROJECT / "tiny-model"
        base_model = str((folder if (folder / "config.json").exists() else build_tiny_model(folder)).resolve())
    config = art.ModelConfig(
        lora_rank=mode.lora_rank,
        lora_alpha=2 * mode.lora_rank,
        max_batch_size=max(mode.puzzles_per_step * mode.group_size, mode.val_puzzles),
    )
    name = args.name or ("tiny-detective" if args.tiny else "detective")
    return art.TrainableModel(name=name, project=PROJECT, base_model=base_model, config=config)


async def run(args: argparse.Namespace, mode: Mode) -> None:
    model = build_model(args, mode)
    train_sampling = Sampling(system_prompt(model.base_model), temperature=1.0, max_tokens=mode.max_tokens)
    eval_sampling = dataclasses.replace(train_sampling, temperature=0.0)
    held_out = [generate_puzzle(HELD_OUT_FIRST_SEED + i) for i in range(mode.val_puzzles)]
    after_each = None
    if mode.references_per_group:
        after_each = functools.partial(add_references, count=mode.references_per_group, sampling=train_sampling)
    backend = art.LocalBackend(args.art_path)
    try:
        await model.register(backend)
        print(f"{model.base_model} solves puzzles; run folder {args.art_path}", flush=True)
        first = await model.get_step()
        before = await evaluate(model, held_out, eval_sampling)
        await art.train_loop(
            model,
            functools.partial(solve, sampling=train_sampling),
            FreshPuzzles(),
            steps=mode.steps,
            groups_per_step=mode.puzzles_per_step,
            rollouts_per_group=mode.group_size,
            train_config=art.TrainConfig(learning_rate=args.learning_rate),
            after_each=after_each,
            after_train=show_step,
        )
        after = await evaluate(model, held_out, eval_sampling)
        last = await model.get_step()
    finally:
        await backend.close()
    print_summary(before, after, held_out, first, last)
    folder = (args.art_path / PROJECT / "models" / model.name).resolve()
    print(f"run folder: {folder} (history.jsonl, trajectories/, checkpoints/)")
    print(f"charts and every reply: art-agents report {folder}")


async def show_step(record: art.StepRecord, groups: list[art.TrajectoryGroup]) -> None:
    skipped = int(record.metrics.get("groups_skipped_zero_variance", 0))
    print(
        f"step {record.step}: {record.rollouts} replies, reward {record.reward_mean:.3f}, "
        f"{skipped} of {len(groups)} groups without spread{'' if record.advanced else ' (nothing trained)'}",
        flush=True,
    )


def print_summary(
    before: dict[str, float], after: dict[str, float], held_out: list[Puzzle], first: int, last: int
) -> None:
    """Held-out rates before and after, beside what a well-formed random guess would get."""
    chance = statistics.fmean(1 / p.size for p in held_out)
    print(f"\nheld-out puzzles ({len(held_out)} seeds never trained on, greedy), step {first} -> step {last}:")
    for name in RATES:
        print(f"  {name:<11} {before[name]:6.3f} -> {after[name]:6.3f}")
    exact_chance = statistics.fmean(1 / p.size**3 for p in held_out)
    print(f"  (a well-formed random guess: {chance:.3f} per field, {exact_chance:.3f} exact)")


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Mode]:
    """The options; those left out take the real run's settings, or the tiny ones with `--tiny`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base-model", default="Qwen/Qwen3-0.6B", help="hub id or local folder of a chat model (default: %(default)s)"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="the random tiny model, built locally, with small settings (learns nothing)"
    )
    parser.add_argument(
        "--art-path", type=Path, default=Path(".art"), help="where the server keeps the run (default: %(default)s)"
    )
    parser.add_argument("--name", help="model name (default: detective, or tiny-detective with --tiny)")
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=art.TrainConfig().learning_rate,
        help="of the LoRA (default: %(default)s)",
    )
    for field, help_text in (
        ("steps", "training steps"),
        ("puzzles_per_step", "puzzles per step, one group of attempts each"),
        ("group_size", "attempts per puzzle in a step"),
        ("val_puzzles", "held-out puzzles, one greedy reply each"),
        ("max_tokens", "per reply"),
        ("lora_rank", "rank of the LoRA"),
        ("references_per_group", "the generator's answer added to each group this many times"),
    ):
        real, tiny = getattr(REAL, field), getattr(TINY, field)
        parser.add_argument(
            "--" + field.replace("_", "-"), type=int, help=f"{help_text} (default: {real}; {tiny} with --tiny)"
        )
    args = parser.parse_args(argv)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Mode) if getattr(args, f.name) is not None}
    return args, dataclasses.replace(TINY if args.tiny else REAL, **given)


def main(argv: list[str] | None = None) -> int:
    args, mode = parse_args(argv)
    try:
        asyncio.run(run(args, mode))
    except art.ArtError as exc:  # the library's errors name the problem and the fix: no traceback needed
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

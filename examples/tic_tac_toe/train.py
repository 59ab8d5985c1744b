"""Teach a chat model to play tic-tac-toe against an opponent in code, with GRPO, and measure it on held-out openings.

A multi-turn agent in its smallest form: each turn the model sees the board as text and answers with one move;
`game.py` plays it, answers with the opponent's move and, at the end, decides the reward (win 1, draw 0.5, loss 0;
an illegal or unparseable move ends the game at -1, plus 0.1 for each legal move before it). The model only ever
sends a move, so the reward cannot be talked up. Every game of one opening (an opponent seed, and who moves first) meets the same opponent, so a group
of games differs only by the model's moves: GRPO's comparison within a group is exactly what this needs.

Rollouts are plain OpenAI SDK calls inside `art_agents.rollout()`, which records each turn with the completion id
the server keeps the sampled tokens under; `art_agents.train_loop` draws openings, plays groups of games and
trains. Openings whose seeds training never sees are played greedily before training and every few steps, and
logged with `model.log(groups, split="val")`, so `history.jsonl` and `art-agents report` show the held-out rates.

    python examples/tic_tac_toe/train.py --tiny                          # CPU: the random tiny model, a minute
    python examples/tic_tac_toe/train.py --base-model Qwen/Qwen3-0.6B    # a GPU and a real model
"""

from __future__ import annotations

from art_agents.extras import exit_unless_installed

exit_unless_installed("examples/tic_tac_toe/train.py", "server")  # before any import of them

import argparse
import asyncio
import dataclasses
import functools
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from game import HELD_OUT_FIRST_SEED, OUTCOMES, Game, Opening, openings

import art_agents as art

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

PROJECT = "tic-tac-toe"

SYSTEM_PROMPT = (
    "You play tic-tac-toe as X against O. Each turn you see the board: X and O where played, the cell's number "
    "where a cell is free. Reply with the number of the free cell you take, and nothing else. A reply that is not "
    "the number of one free cell loses the game."
)


@dataclasses.dataclass(frozen=True)
class Mode:
    """The settings that differ between a real run and the tiny CPU check (`--tiny`)."""

    steps: int
    groups_per_step: int
    games_per_group: int
    openings: int
    eval_openings: int
    eval_every: int
    max_tokens: int
    lora_rank: int


REAL = Mode(
    steps=40,
    groups_per_step=8,
    games_per_group=8,
    openings=256,
    eval_openings=64,
    eval_every=5,
    max_tokens=32,
    lora_rank=16,
)
# The random tiny model sends a legal first move in about 1 reply of 6 (11 of 64 sampled at 8 tokens): with 8 games
# a group, most groups have a spread of rewards to train on.
TINY = Mode(
    steps=2,
    groups_per_step=2,
    games_per_group=8,
    openings=8,
    eval_openings=4,
    eval_every=1,
    max_tokens=8,
    lora_rank=4,
)


@dataclasses.dataclass(frozen=True)
class Sampling:
    system_prompt: str
    temperature: float
    max_tokens: int


def system_prompt(base_model: str) -> str:
    """Qwen3 reasons at length before answering unless told `/no_think`; a move needs no such budget."""
    return SYSTEM_PROMPT + (" /no_think" if "qwen3" in base_model.lower() else "")


def board_message(game: Game, first: bool) -> str:
    """What the model is shown before each of its moves: the opponent's last move, then the board."""
    if game.last_opponent_move is None:
        news = "New game: you move first."
    else:
        news = f"{'New game: ' if first else ''}O took cell {game.last_opponent_move + 1}."
    return f"{news}\n\n{game.render()}\n\nYour move:"


async def play(model: art.TrainableModel, opening: Opening, *, sampling: Sampling) -> art.Trajectory:
    """One game, one model call per move; the conversation grows turn by turn, as the model sees it."""
    game = Game(opening)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": sampling.system_prompt},
        {"role": "user", "content": board_message(game, first=True)},
    ]
    async with (
        model.openai_client() as client,
        art.rollout(seed=opening.seed, opponent_first=opening.opponent_first) as trajectory,
    ):
        while game.outcome is None:
            response = await client.chat.completions.create(
                model=model.name,
                messages=messages,
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
            )
            reply = response.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": reply})
            game.play(reply)
            if game.outcome is None:
                messages.append({"role": "user", "content": board_message(game, first=False)})
        trajectory.reward = game.reward
        trajectory.metrics.update({outcome: float(game.outcome == outcome) for outcome in OUTCOMES})
        trajectory.metrics["model_moves"] = game.model_moves
    return trajectory


def rates(groups: list[art.TrajectoryGroup]) -> dict[str, float]:
    """The share of games won, drawn, lost and ended by an illegal move, and the mean reward."""
    games = [t for g in groups for t in g.trajectories]
    shares = {outcome: statistics.fmean(t.metrics[outcome] for t in games) for outcome in OUTCOMES}
    return {**shares, "reward": statistics.fmean(t.reward for t in games)}


def show_rates(values: dict[str, float]) -> str:
    return "  ".join(f"{name} {value:.3f}" for name, value in values.items())


async def evaluate(model: art.TrainableModel, held_out: list[Opening], sampling: Sampling) -> dict[str, float]:
    """One greedy game per held-out opening, logged as the `val` split at the served step."""
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup([play(model, opening, sampling=sampling)]) for opening in held_out),
        pbar_desc="held-out games",
        max_exceptions=0,
    )
    result = await model.log(groups, split="val")
    values = rates(groups)
    print(f"step {result.step}: held-out  {show_rates(values)}", flush=True)
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
        max_batch_size=max(mode.groups_per_step * mode.games_per_group, mode.eval_openings),
        seed=args.seed,
    )
    name = args.name or ("tiny-player" if args.tiny else "player")
    return art.TrainableModel(name=name, project=PROJECT, base_model=base_model, config=config)


async def run(args: argparse.Namespace, mode: Mode) -> None:
    model = build_model(args, mode)
    train_sampling = Sampling(system_prompt(model.base_model), temperature=1.0, max_tokens=mode.max_tokens)
    eval_sampling = Sampling(train_sampling.system_prompt, temperature=0.0, max_tokens=mode.max_tokens)
    held_out = openings(HELD_OUT_FIRST_SEED, mode.eval_openings)
    backend = art.LocalBackend(args.art_path)
    try:
        await model.register(backend)
        print(f"{model.base_model} plays X as {PROJECT}/{model.name}, served from {args.art_path}", flush=True)
        start = await model.get_step()
        evaluations = {"before": await evaluate(model, held_out, eval_sampling)}

        async def after_train(record: art.StepRecord, groups: list[art.TrajectoryGroup]) -> None:
            skipped = int(record.metrics.get("groups_skipped_zero_variance", 0))
            print(
                f"step {record.step}: trained on {record.rollouts} games, reward {record.reward_mean:.3f}, "
                f"{skipped} of {len(groups)} groups without spread{'' if record.advanced else ' (nothing trained)'}",
                flush=True,
            )
            if record.advanced and (record.step % mode.eval_every == 0 or record.step >= start + mode.steps):
                evaluations["after"] = await evaluate(model, held_out, eval_sampling)

        await art.train_loop(
            model,
            functools.partial(play, sampling=train_sampling),
            openings(0, mode.openings),
            steps=mode.steps,
            groups_per_step=mode.groups_per_step,
            rollouts_per_group=mode.games_per_group,
            train_config=art.TrainConfig(learning_rate=args.learning_rate),
            after_train=after_train,
            seed=args.seed,
        )
        final_step = await model.get_step()
    finally:
        await backend.close()
    print_summary(evaluations["before"], evaluations["after"], len(held_out), start, final_step)
    folder = args.art_path / PROJECT / "models" / model.name
    print(f"run folder: {folder.resolve()} (history.jsonl, trajectories/, checkpoints/)")
    print(f"charts and every game: art-agents report {folder.resolve()}")


def print_summary(before: dict[str, float], after: dict[str, float], games: int, first: int, last: int) -> None:
    print(f"\nheld-out openings ({games} opponent seeds never trained on, greedy), step {first} -> step {last}:")
    for name in before:
        print(f"  {name:<8} {before[name]:6.3f} -> {after[name]:6.3f}")
    print(f"yardsticks on these openings: python {Path(__file__).with_name('baselines.py')} --eval-openings {games}")


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
    parser.add_argument("--name", help="model name (default: player, or tiny-player with --tiny)")
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=art.TrainConfig().learning_rate,
        help="of the LoRA (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="LoRA initialisation and the order of the openings (default: %(default)s)"
    )
    for field, help_text in (
        ("steps", "training steps"),
        ("groups_per_step", "openings per step, one group of games each"),
        ("games_per_group", "games per opening in a step"),
        ("openings", "training openings (opponent seeds 0, 1, ...)"),
        ("eval_openings", "held-out openings, one greedy game each"),
        ("eval_every", "evaluate every this many steps (and after the last)"),
        ("max_tokens", "per model reply"),
        ("lora_rank", "rank of the LoRA"),
    ):
        real, tiny = getattr(REAL, field), getattr(TINY, field)
        flag = "--" + field.replace("_", "-")
        parser.add_argument(flag, type=int, help=f"{help_text} (default: {real}; {tiny} with --tiny)")
    args = parser.parse_args(argv)
    chosen = TINY if args.tiny else REAL
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Mode)}
    mode = dataclasses.replace(chosen, **{name: value for name, value in given.items() if value is not None})
    if mode.openings > HELD_OUT_FIRST_SEED:
        parser.error(f"--openings must be at most {HELD_OUT_FIRST_SEED}: the held-out seeds start there")
    return args, mode


def main(argv: list[str] | None = None) -> int:
    args, mode = parse_args(argv)
    asyncio.run(run(args, mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())

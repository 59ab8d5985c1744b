"""Yardsticks for train.py's held-out rates: a player with no skill and perfect play, computed exactly.

The before/after rates a run prints mean more beside two fixed points on the same held-out openings: a player that
takes a free cell uniformly at random (always legal, never skilled) and the best play. The opponent is
deterministic per seed, so each opening's game tree is small enough to search whole: both are exact, not sampled.

    python examples/tic_tac_toe/baselines.py [--eval-openings 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from game import HELD_OUT_FIRST_SEED, OUTCOMES, REWARDS, Game, Outcome, free_cells, openings

RANK: dict[Outcome, int] = {"loss": 0, "draw": 1, "win": 2}


def after(game: Game, cell: int) -> Game:
    following = game.branch()
    following.play(str(cell + 1))
    return following


def random_player(game: Game) -> dict[Outcome, float]:
    """The chance of each outcome when every move is a free cell drawn uniformly at random."""
    if game.outcome is not None:
        return {game.outcome: 1.0}
    cells = free_cells(game.cells)
    chances = dict.fromkeys(OUTCOMES, 0.0)
    for cell in cells:
        for outcome, chance in random_player(after(game, cell)).items():
            chances[outcome] += chance / len(cells)
    return chances


def best_play(game: Game) -> Outcome:
    """The best outcome legal play can force from here against this deterministic opponent."""
    if game.outcome is not None:
        return game.outcome
    return max((best_play(after(game, cell)) for cell in free_cells(game.cells)), key=RANK.__getitem__)


def line(label: str, shares: list[dict[Outcome, float]]) -> str:
    """Mean share of each outcome over the openings, and the mean reward they give."""
    rates = {outcome: statistics.fmean(s.get(outcome, 0.0) for s in shares) for outcome in OUTCOMES}
    reward = sum(REWARDS[outcome] * rate for outcome, rate in rates.items())
    return f"  {label:<24}" + "  ".join(f"{name} {value:.3f}" for name, value in {**rates, "reward": reward}.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eval-openings", type=int, default=64, help="held-out openings (default: train.py's, 64)")
    count = parser.parse_args(argv).eval_openings
    held_out = openings(HELD_OUT_FIRST_SEED, count)
    first = sum(o.opponent_first for o in held_out)
    print(f"held-out openings: {count} (seeds from {HELD_OUT_FIRST_SEED}; the opponent moves first in {first})")
    print(line("a random legal player", [random_player(Game(o)) for o in held_out]))
    print(line("the best play", [{best_play(Game(o)): 1.0} for o in held_out]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

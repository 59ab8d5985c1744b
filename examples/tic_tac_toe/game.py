"""Tic-tac-toe in plain Python: the board, a seeded opponent, the move parser and the reward.

This module is the judge, and it knows nothing about models or training: the model only sends text, this code
reads one move out of it, plays it, answers with the opponent's move and decides how the game ended. A reply
cannot claim a result, score itself or skip the rules, so the reward below measures play and nothing else.

The opponent is deterministic for a given seed: it takes a winning move, else blocks the model's winning move,
else plays a legal move drawn from a generator seeded by its seed and the board. An opening (a seed and who moves
first) therefore always plays the same way against the same moves, which is what makes it a fair group for GRPO
and a fixed held-out test: only the model's moves tell two games of one opening apart.
"""

from __future__ import annotations

import copy
import random
import re
from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["win", "draw", "loss", "illegal"]
OUTCOMES: tuple[Outcome, ...] = ("win", "draw", "loss", "illegal")
# An illegal or unparseable move scores below a loss: otherwise a model about to lose could end the game early by
# sending nonsense and do no worse than losing. Each legal move made before it earns back a little, at most 4 x 0.1,
# so any game played to its end still beats any game ended by an illegal move; a model that rarely sends a legal move
# (a small one, early on) gets a signal toward legal moves instead of a flat -1 in every game of a group.
REWARDS: dict[Outcome, float] = {"win": 1.0, "draw": 0.5, "loss": 0.0, "illegal": -1.0}
LEGAL_MOVE_CREDIT = 0.1

MODEL, OPPONENT, EMPTY = "X", "O", " "
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


HELD_OUT_FIRST_SEED = 1_000_000  # training openings take seeds from 0, far below: the two never meet


@dataclass(frozen=True)
class Opening:
    """One scenario: the opponent's seed and whether it moves first (the model always plays X)."""

    seed: int
    opponent_first: bool


def openings(first_seed: int, count: int) -> list[Opening]:
    """`count` openings with consecutive seeds from `first_seed`; the opponent moves first in every other one."""
    return [Opening(seed, opponent_first=seed % 2 == 1) for seed in range(first_seed, first_seed + count)]


def winner(cells: list[str]) -> str | None:
    return next((cells[a] for a, b, c in LINES if cells[a] != EMPTY and cells[a] == cells[b] == cells[c]), None)


def free_cells(cells: list[str]) -> list[int]:
    return [i for i, cell in enumerate(cells) if cell == EMPTY]


def completing_move(cells: list[str], mark: str) -> int | None:
    """A free cell that would give `mark` three in a row, if any (the lowest such cell)."""
    for i in free_cells(cells):
        if winner([mark if j == i else cell for j, cell in enumerate(cells)]) == mark:
            return i
    return None


def opponent_move(cells: list[str], seed: int) -> int:
    """Win if possible, else block, else a legal move drawn from a generator seeded by `seed` and the board."""
    for mark in (OPPONENT, MODEL):
        cell = completing_move(cells, mark)
        if cell is not None:
            return cell
    return random.Random(f"{seed}:{''.join(cells)}").choice(free_cells(cells))


def parse_move(reply: str) -> int | None:
    """The cell (0-8) of a reply holding exactly one number, 1 to 9; None for anything else.

    A reasoning model's `<think>...</think>` block is ignored (a reply cut off inside one is unparseable). Two
    numbers ("5, or 7") or a number out of range make the move unparseable: the reply must name one cell.
    """
    if "<think>" in reply and "</think>" not in reply:
        return None
    numbers = re.findall(r"\d+", reply.rsplit("</think>", 1)[-1])
    if len(numbers) != 1 or not 1 <= int(numbers[0]) <= 9:
        return None
    return int(numbers[0]) - 1


@dataclass
class Game:
    """One game in progress. `play` takes the model's reply and answers with the opponent's move."""

    opening: Opening
    cells: list[str] = field(default_factory=lambda: [EMPTY] * 9)
    outcome: Outcome | None = None
    model_moves: int = 0
    last_opponent_move: int | None = None

    def __post_init__(self) -> None:
        if self.opening.opponent_first:
            self._opponent_plays()

    def play(self, reply: str) -> None:
        """Play the model's move, then the opponent's; sets `outcome` when the game is over."""
        if self.outcome is not None:
            raise ValueError(f"the game is over ({self.outcome})")
        cell = parse_move(reply)
        if cell is None or self.cells[cell] != EMPTY:
            self.outcome = "illegal"
            return
        self.cells[cell] = MODEL
        self.model_moves += 1
        if not self._ended():
            self._opponent_plays()
            self._ended()

    def branch(self) -> Game:
        """An independent copy of the game as it stands (`dataclasses.replace` would let the opponent open again)."""
        twin = copy.copy(self)
        twin.cells = list(self.cells)
        return twin

    def render(self) -> str:
        """The board as text: X and O where played, a free cell's number where free."""
        shown = [cell if cell != EMPTY else str(i + 1) for i, cell in enumerate(self.cells)]
        rows = [f" {shown[r]} | {shown[r + 1]} | {shown[r + 2]}" for r in (0, 3, 6)]
        return "\n---+---+---\n".join(rows)

    @property
    def reward(self) -> float:
        """1 won, 0.5 drawn, 0 lost; an illegal move -1, plus 0.1 for each legal move before it (at most -0.6)."""
        if self.outcome is None:
            raise ValueError("the game is not over yet")
        credit = LEGAL_MOVE_CREDIT * self.model_moves if self.outcome == "illegal" else 0.0
        return REWARDS[self.outcome] + credit

    def _opponent_plays(self) -> None:
        self.last_opponent_move = opponent_move(self.cells, self.opening.seed)
        self.cells[self.last_opponent_move] = OPPONENT

    def _ended(self) -> bool:
        mark = winner(self.cells)
        if mark is not None:
            self.outcome = "win" if mark == MODEL else "loss"
        elif not free_cells(self.cells):
            self.outcome = "draw"
        return self.outcome is not None

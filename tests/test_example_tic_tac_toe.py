"""examples/tic_tac_toe: the game engine judges every move as the README says, and the script runs end to end.

The engine is what makes the reward impossible to game, so its rules are checked one by one (parsing, illegal moves,
wins, draws, losses, the opponent's priorities) and over every game a model could play against a few openings.
The slow test runs the script as CI does (`--tiny`), so the example cannot rot.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tic_tac_toe"


def load(name: str) -> ModuleType:
    """`examples/tic_tac_toe/<name>.py` (scripts beside each other, not a package) as the module `name`.

    Registered under its own name, as the scripts import it (`from game import ...`); dataclasses need that too.
    """
    spec = importlib.util.spec_from_file_location(name, EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


game = load("game")
baselines = load("baselines")


def board(rows: str) -> list[str]:
    """'XX. OO. ...' -> cells, '.' for a free cell."""
    return [game.EMPTY if c == "." else c for c in rows.replace(" ", "")]


def position(rows: str, seed: int = 0) -> game.Game:
    return game.Game(game.Opening(seed, opponent_first=False), cells=board(rows))


@pytest.mark.parametrize(
    ("reply", "cell"),
    [
        ("5", 4),
        (" 9.\n", 8),
        ("I take cell 1", 0),
        ("<think>\n\n</think>\n\n3", 2),
        ("<think>cells 1 and 2 are taken</think> 7", 6),
        ("<think>cell 5 looks", None),  # cut off while thinking
        ("0", None),
        ("10", None),
        ("5 or 7", None),
        ("five", None),
        ("", None),
    ],
)
def test_a_reply_names_one_cell_or_none(reply: str, cell: int | None) -> None:
    assert game.parse_move(reply) == cell


def test_an_illegal_move_ends_the_game_below_any_loss() -> None:
    played = position("X.. .O. ...")
    played.model_moves = 1
    played.play("5")  # taken by O
    assert played.outcome == "illegal" and played.cells == board("X.. .O. ...")
    assert played.reward == pytest.approx(-0.9)
    with pytest.raises(ValueError, match="over"):
        played.play("3")

    unparseable = game.Game(game.Opening(0, opponent_first=False))
    unparseable.play("I win!")
    assert unparseable.outcome == "illegal" and unparseable.reward == -1.0
    assert unparseable.cells == board("... ... ...")


def test_three_in_a_row_wins_before_the_opponent_moves() -> None:
    played = position("XX. OO. ...")
    played.play("3")
    assert (played.outcome, played.reward) == ("win", 1.0)
    assert played.cells == board("XXX OO. ...")


def test_the_opponent_takes_its_own_win_before_blocking() -> None:
    played = position("XX. OO. ...")
    played.play("9")  # leaves both X's threat (3) and O's (6) open
    assert played.cells == board("XX. OOO ..X")
    assert (played.outcome, played.reward, played.last_opponent_move) == ("loss", 0.0, 5)


def test_the_opponent_blocks_a_threat() -> None:
    for seed in range(10):  # whatever its seed: a block is not left to chance
        played = position("X.. .O. ...", seed)
        played.play("2")
        assert played.cells == board("XXO .O. ...") and played.outcome is None


def test_filling_the_board_without_a_line_is_a_draw() -> None:
    played = position("XOX XOO OX.")
    played.play("9")
    assert (played.outcome, played.reward) == ("draw", 0.5)


def test_the_opponent_is_deterministic_per_seed_and_varies_across_seeds() -> None:
    empty = board("... ... ...")
    assert [game.opponent_move(empty, seed) for seed in range(20)] == [
        game.opponent_move(list(empty), seed) for seed in range(20)
    ]
    assert len({game.opponent_move(empty, seed) for seed in range(20)}) > 3
    first, second = game.openings(0, 2)
    assert (first.opponent_first, second.opponent_first) == (False, True)
    assert game.Game(second).cells.count("O") == 1 and game.Game(first).cells.count("O") == 0
    assert [o.seed for o in game.openings(1_000_000, 3)] == [1_000_000, 1_000_001, 1_000_002]


def test_the_board_shows_free_cells_by_number() -> None:
    shown = position("X.. .O. ...").render()
    assert shown.splitlines() == [" X | 2 | 3", "---+---+---", " 4 | O | 6", "---+---+---", " 7 | 8 | 9"]


def every_ending(played: game.Game) -> Iterator[game.Game]:
    """Every way a game can end from here: each free cell, and one illegal move, at every turn."""
    if played.outcome is not None:
        yield played
        return
    for reply in [*(str(cell + 1) for cell in game.free_cells(played.cells)), "no move"]:
        after = played.branch()
        after.play(reply)
        yield from every_ending(after)


def test_no_way_of_playing_scores_outside_the_rules() -> None:
    """Over every game against four openings: a finished game beats any illegal ending, and the outcome is the board's."""
    endings = [e for opening in game.openings(0, 4) for e in every_ending(game.Game(opening))]
    assert {e.outcome for e in endings} == set(game.OUTCOMES)
    illegal = [e.reward for e in endings if e.outcome == "illegal"]
    finished = [e for e in endings if e.outcome != "illegal"]
    assert max(illegal) == pytest.approx(-0.6) and min(illegal) == -1.0
    assert min(e.reward for e in finished) == 0.0
    for e in finished:
        mark = game.winner(e.cells)
        expected = {"X": "win", "O": "loss", None: "draw"}[mark]
        assert e.outcome == expected and (mark is not None or not game.free_cells(e.cells))


def test_the_yardsticks_are_exact() -> None:
    last_cell = position("XOX XOO OX.")
    assert baselines.random_player(last_cell) == {**dict.fromkeys(game.OUTCOMES, 0.0), "draw": 1.0}
    # Five free cells. 3 wins at once; 7, 8 or 9 lets O complete its row at 6. 6 blocks it, O blocks at 3 and
    # threatens 3-5-7: of X's three moves left only 7 blocks that (a draw), 8 and 9 lose.
    threat = position("XX. OO. ...")
    expected = {"win": 1 / 5, "draw": 1 / 5 * 1 / 3, "loss": 3 / 5 + 1 / 5 * 2 / 3, "illegal": 0.0}
    assert baselines.random_player(threat) == pytest.approx(expected)
    assert baselines.best_play(threat) == "win"
    for opening in game.openings(0, 2):
        assert sum(baselines.random_player(game.Game(opening)).values()) == pytest.approx(1.0)


@pytest.mark.slow  # a whole run on the tiny model; CI runs it with -m slow
def test_the_tiny_run_trains_logs_held_out_games_and_reports(tmp_path: Path) -> None:
    script = EXAMPLE / "train.py"
    assert (
        "--games-per-group"
        in subprocess.run(
            [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    )
    done = subprocess.run(
        [sys.executable, str(script), "--tiny", "--art-path", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    folder = tmp_path / "tic-tac-toe" / "models" / "tiny-player"
    rows = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "split" not in r] == [1, 2]
    val = [r for r in rows if r.get("split") == "val"]
    assert [r["step"] for r in val] == [0, 1, 2]
    for row in val:
        metrics = row["metrics"]
        assert sum(metrics[f"val/{o}"] for o in ("win", "draw", "loss", "illegal")) == pytest.approx(1.0)
        assert -1.0 <= metrics["val/reward"] <= 1.0
    assert (folder / "trajectories" / "val" / "0000.jsonl").exists()
    assert (folder / "trajectories" / "val" / "0002.jsonl").exists()

    summary = done.stdout.split("held-out openings", 1)[1]
    assert "step 0 -> step 2" in summary
    for name in ("win", "draw", "loss", "illegal", "reward"):
        assert re.search(rf"^  {name} +-?\d\.\d{{3}} -> +-?\d\.\d{{3}}$", summary, re.MULTILINE), name
    assert f"art-agents report {folder.resolve()}" in done.stdout

"""examples/logic_puzzles: every puzzle has exactly one solution, the reward pays only a committed answer, and the
script runs end to end.

Uniqueness is checked by plain brute force (every grid against every clue's definition), independently of the
bitsets the generator uses. The slow test runs the script as CI does (`--tiny`), so the example cannot rot.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "logic_puzzles"


def load(name: str) -> ModuleType:
    """`examples/logic_puzzles/<name>.py` (a script's sibling, not a package) as the module `logic_puzzles_<name>`."""
    spec = importlib.util.spec_from_file_location(f"logic_puzzles_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


generator, reward = load("generator"), load("reward")
SEEDS = range(300)


def consistent(puzzle: generator.Puzzle) -> list[generator.Grid]:
    return [grid for grid in generator.all_grids(puzzle.size) if all(c.holds(grid) for c in puzzle.clues)]


@pytest.mark.parametrize("seeds", [SEEDS[i : i + 100] for i in range(0, len(SEEDS), 100)], ids=lambda s: str(s))
def test_every_puzzle_has_exactly_its_solution(seeds: range) -> None:
    sizes = set()
    for seed in seeds:
        puzzle = generator.generate_puzzle(seed)
        assert consistent(puzzle) == [puzzle.solution], f"seed {seed}"
        sizes.add(puzzle.size)
    assert sizes == {3, 4}


@pytest.mark.parametrize("seed", range(12))
def test_every_clue_is_needed(seed: int) -> None:
    puzzle = generator.generate_puzzle(seed)
    for clue in puzzle.clues:
        rest = dataclasses.replace(puzzle, clues=tuple(c for c in puzzle.clues if c != clue))
        assert len(consistent(rest)) > 1, f"seed {seed}: {generator.describe(clue, puzzle.names)} is implied"


def test_puzzles_are_fixed_per_seed_and_vary_across_seeds() -> None:
    assert generator.generate_puzzle(7) == generator.generate_puzzle(7)
    assert generator.generate_puzzle(7, size=4).size == 4
    texts = {generator.generate_puzzle(seed).text() for seed in range(50)}
    assert len(texts) == 50
    kinds = {clue.kind for seed in range(50) for clue in generator.generate_puzzle(seed).clues}
    assert kinds == {"same", "not", "earlier", "hour_after"}


def test_the_answer_is_the_person_at_the_murder_hour() -> None:
    puzzle = generator.generate_puzzle(3)
    person = puzzle.solution[generator.TIME].index(puzzle.murder_hour)
    suspect, weapon, room = puzzle.answer
    assert suspect == puzzle.names[generator.SUSPECT][person]
    assert weapon == puzzle.names[generator.WEAPON][puzzle.solution[generator.WEAPON][person]]
    assert room == puzzle.names[generator.ROOM][puzzle.solution[generator.ROOM][person]]
    hour = puzzle.names[generator.TIME][puzzle.murder_hour]
    assert f"The victim was killed at {hour}" in puzzle.text()
    assert len(re.findall(r"^\d+\. ", puzzle.text(), flags=re.MULTILINE)) == len(puzzle.clues)


NAMES = (
    ("Mustard", "Plum", "Scarlet"),
    ("rope", "knife", "wrench"),
    ("hall", "study", "cellar"),
    ("8 pm", "9 pm", "10 pm"),
)
# Mustard: knife, cellar, 9 pm; Plum: rope, hall, 10 pm; Scarlet: wrench, study, 8 pm
GRID = ((0, 1, 2), (1, 0, 2), (2, 0, 1), (1, 2, 0))


@pytest.mark.parametrize(
    ("kind", "a", "b", "text", "holds"),
    [
        ("same", (0, 1), (1, 0), "Plum carried the rope.", True),
        ("same", (1, 2), (2, 1), "The person with the wrench went to the study.", True),
        ("not", (2, 0), (3, 1), "The person who went to the hall did not come at 9 pm.", True),
        ("not", (0, 0), (1, 1), "Mustard did not carry the knife.", False),
        ("earlier", (1, 2), (0, 0), "The person with the wrench came earlier than Mustard.", True),
        ("earlier", (0, 1), (2, 2), "Plum came earlier than the person who went to the cellar.", False),
        ("hour_after", (2, 0), (0, 0), "The person who went to the hall came exactly one hour after Mustard.", True),
        ("hour_after", (0, 1), (0, 2), "Plum came exactly one hour after Scarlet.", False),
    ],
)
def test_a_clue_says_what_it_checks(kind: str, a: tuple[int, int], b: tuple[int, int], text: str, holds: bool) -> None:
    clue = generator.Clue(kind, generator.Fact(*a), generator.Fact(*b))  # type: ignore[arg-type]
    assert generator.describe(clue, NAMES) == text
    assert clue.holds(GRID) is holds


OPTIONS = NAMES[:3]
ANSWER = ("Plum", "rope", "hall")


@pytest.mark.parametrize(
    ("reply", "value", "well_formed"),
    [
        ("Plum came at 10 pm, so...\nANSWER: Plum, rope, hall", 1.0, True),
        ("ANSWER:  plum ,Rope, HALL  \n\n", 1.0, True),  # case and spaces aside
        ("<think>\nANSWER: Mustard, knife, study\n</think>\n\nANSWER: Plum, rope, hall", 1.0, True),
        ("ANSWER: Plum, rope, study", 2 / 3, True),
        ("ANSWER: Scarlet, rope, study", 1 / 3, True),
        ("ANSWER: Scarlet, knife, study", 0.0, True),
        ("Plum did it with the rope in the hall.", 0.0, False),  # no answer line
        ("", 0.0, False),
        ("<think>Plum had the rope, so", 0.0, False),  # cut off while thinking
        ("ANSWER: Plum, rope, hall\nI am quite sure.", 0.0, False),  # not the last line
        ("ANSWER: Scarlet, knife, study\nANSWER: Plum, rope, hall", 0.0, False),  # several answers
        ("ANSWER: Plum or Scarlet, rope, hall", 0.0, False),
        ("ANSWER: Plum/Scarlet, rope, hall", 0.0, False),
        ("ANSWER: Plum, Scarlet, rope, hall", 0.0, False),
        ("ANSWER: Plum, rope", 0.0, False),
        ("ANSWER: rope, Plum, hall", 0.0, False),  # right names, wrong places
        ("ANSWER: Plum, gun, hall", 0.0, False),  # not an option
        ("answer: Plum, rope, hall", 0.0, False),
        ("**ANSWER:** Plum, rope, hall", 0.0, False),
        ("ANSWER: Plum, rope, hall.", 0.0, False),
    ],
)
def test_the_reward_reads_only_a_well_formed_last_line(reply: str, value: float, well_formed: bool) -> None:
    result = reward.score(reply, OPTIONS, ANSWER)
    assert result.reward == pytest.approx(value)
    assert result.well_formed is well_formed
    assert result.exact is (value == 1.0)


@pytest.mark.parametrize("seed", range(20))
def test_one_answer_of_all_pays_in_full_and_no_hedge_pays(seed: int) -> None:
    puzzle = generator.generate_puzzle(seed)
    answers = list(itertools.product(*puzzle.options))
    full = [a for a in answers if reward.score(f"ANSWER: {', '.join(a)}", puzzle.options, puzzle.answer).exact]
    assert full == [puzzle.answer]
    everyone = "ANSWER: " + ", ".join(" or ".join(names) for names in puzzle.options)
    every_line = "\n".join(f"ANSWER: {', '.join(a)}" for a in answers)
    echo = puzzle.text()  # the clues name every suspect, weapon and room
    for reply in (everyone, every_line, echo, echo + "\n" + ", ".join(puzzle.answer)):
        assert reward.score(reply, puzzle.options, puzzle.answer).reward == 0.0


@pytest.mark.slow  # a whole run on the tiny model; CI runs it with -m slow
def test_the_tiny_run_trains_and_evaluates(tmp_path: Path) -> None:
    command = [sys.executable, str(EXAMPLE / "train.py"), "--tiny", "--art-path", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    folder = tmp_path / "logic-puzzles" / "models" / "tiny-detective"
    rows = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
    val = [row for row in rows if row.get("split") == "val"]
    train = [row for row in rows if row.get("split") is None]
    assert [row["step"] for row in val] == [0, 2]
    assert [row["step"] for row in train] == [1, 2]
    for row in val:
        assert row["metrics"]["val/n"] == 4
        assert {f"val/{name}" for name in ("exact", "suspect", "weapon", "room", "well_formed")} <= set(row["metrics"])
    for row in train:  # 2 puzzles x (4 attempts + the reference answer), which trains re-tokenized
        assert row["metrics"]["n"] == 10 and row["metrics"]["turns_retokenized"] == 2
        assert row["metrics"]["groups_skipped_zero_variance"] == 0

    out = done.stdout
    assert "held-out puzzles (4 seeds never trained on, greedy), step 0 -> step 2:" in out
    for name in ("exact", "suspect", "weapon", "room", "well_formed"):
        assert re.search(rf"^  {name} +\d\.\d{{3}} -> +\d\.\d{{3}}$", out, flags=re.MULTILINE), name
    assert f"art-agents report {folder.resolve()}" in out

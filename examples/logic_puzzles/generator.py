"""Seeded "who did it, with what, where" logic puzzles whose answer is unique by construction.

A puzzle is a small logic grid in the style of ART's Temporal Clue, but generated here so that any
number of training and held-out puzzles exist and every answer is known. Three or four suspects each
came to the manor once, at different hours, each carrying a different weapon into a different room:
the hidden solution is one permutation of weapons, rooms and hours over the suspects. Clues are true
statements about it: direct ("Plum carried the rope"), negative ("the person in the study did not come
at 9 pm") and relational ("Scarlet came exactly one hour after the person with the knife").

Clues are added from a seeded shuffle while each still rules out some candidate solution, until
exactly one remains, then every clue the others already imply is dropped, so each clue matters.
Uniqueness is checked by brute force: all (n!)^3 grids (216 for three suspects, 13,824 for four)
are candidates, each kept as one bit of a Python int per clue, so a puzzle takes milliseconds.
The question names the hour of the murder and asks for the suspect, weapon and room of that hour.
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass
from typing import Literal

SUSPECT, WEAPON, ROOM, TIME = range(4)
CATEGORY_NAMES = ("suspect", "weapon", "room", "time")
SUSPECTS = ("Mustard", "Plum", "Scarlet", "Peacock", "Green", "White")
WEAPONS = ("rope", "knife", "candlestick", "revolver", "wrench", "poison")
ROOMS = ("kitchen", "library", "study", "hall", "lounge", "ballroom", "cellar")
FIRST_HOURS = (6, 7, 8)  # so the last of four hours is 11 pm at the latest

# A grid: grid[category][person] is the index of that person's value in the category; person p is suspect p.
Grid = tuple[tuple[int, ...], ...]
ClueKind = Literal["same", "not", "earlier", "hour_after"]
# Direct clues settle a puzzle fastest; ranking them later in the shuffle leaves room for the other kinds.
KIND_WEIGHT: dict[ClueKind, float] = {"same": 2.0, "not": 1.0, "earlier": 1.0, "hour_after": 1.0}


@dataclass(frozen=True)
class Fact:
    """How a clue points at someone: the person whose `category` is value number `value`."""

    category: int
    value: int

    def person(self, grid: Grid) -> int:
        return grid[self.category].index(self.value)


@dataclass(frozen=True)
class Clue:
    """A statement about two people named by facts: the same person, not the same, or their hours' order."""

    kind: ClueKind
    a: Fact
    b: Fact

    def holds(self, grid: Grid) -> bool:
        """Whether the clue is true of `grid`: the plain definition, which tests check the generator against."""
        pa, pb = self.a.person(grid), self.b.person(grid)
        hours = grid[TIME]
        if self.kind == "same":
            return pa == pb
        if self.kind == "not":
            return pa != pb
        if self.kind == "earlier":
            return hours[pa] < hours[pb]
        return hours[pa] == hours[pb] + 1


@dataclass(frozen=True)
class Puzzle:
    seed: int
    names: tuple[tuple[str, ...], ...]  # names[category][value]
    solution: Grid
    clues: tuple[Clue, ...]
    murder_hour: int  # index into names[TIME]

    @property
    def size(self) -> int:
        return len(self.solution[SUSPECT])

    @property
    def answer(self) -> tuple[str, str, str]:
        """(suspect, weapon, room) of the person who came at the murder hour."""
        person = Fact(TIME, self.murder_hour).person(self.solution)
        return (
            self.names[SUSPECT][person],
            self.names[WEAPON][self.solution[WEAPON][person]],
            self.names[ROOM][self.solution[ROOM][person]],
        )

    @property
    def options(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """The names an answer may use, per field: suspects, weapons, rooms."""
        return self.names[SUSPECT], self.names[WEAPON], self.names[ROOM]

    def text(self) -> str:
        """The puzzle as the model reads it: the setting, the numbered clues and the question."""
        suspects, weapons, rooms, hours = (_listing(names) for names in self.names)
        lines = [
            f"{suspects} each came to the manor once tonight, each at a different hour ({hours}), each carrying "
            f"a different weapon ({weapons}) into a different room ({rooms}).",
            "",
            "Clues:",
            *(f"{i}. {describe(clue, self.names)}" for i, clue in enumerate(self.clues, start=1)),
            "",
            f"The victim was killed at {self.names[TIME][self.murder_hour]} by the person who came at that hour, "
            "with the weapon they carried, in the room they went to. Who did it, with which weapon, and where?",
        ]
        return "\n".join(lines)


def generate_puzzle(seed: int, size: int | None = None) -> Puzzle:
    """The puzzle of `seed`: the same seed always gives the same puzzle; `size` suspects (3 or 4, else by seed)."""
    rng = random.Random(seed)
    n = size or rng.choice((3, 4))
    first = rng.choice(FIRST_HOURS)
    names = (
        tuple(rng.sample(SUSPECTS, n)),
        tuple(rng.sample(WEAPONS, n)),
        tuple(rng.sample(ROOMS, n)),
        tuple(f"{first + i} pm" for i in range(n)),
    )
    solution: Grid = (tuple(range(n)), *(tuple(rng.sample(range(n), n)) for _ in range(3)))
    return Puzzle(seed, names, solution, _clues_for(solution, rng), rng.randrange(n))


@functools.cache
def all_grids(n: int) -> tuple[Grid, ...]:
    """Every candidate solution with `n` suspects: (n!)^3 grids."""
    perms = list(itertools.permutations(range(n)))
    return tuple((tuple(range(n)), w, r, t) for w, r, t in itertools.product(perms, repeat=3))


def true_clues(solution: Grid) -> list[Clue]:
    """Every clue of every kind that `solution` makes true (each pair of facts once, facts about hours only in
    direct clues, since "earlier than 9 pm" would give the hour away)."""
    n = len(solution[SUSPECT])
    facts = [Fact(c, v) for c in range(4) for v in range(n)]
    clues = []
    for a, b in itertools.permutations(facts, 2):
        if a.category == b.category:
            continue
        if a.category < b.category:
            clues.append(Clue("same", a, b))
            clues.append(Clue("not", a, b))
        if TIME not in (a.category, b.category):
            clues.append(Clue("earlier", a, b))
            clues.append(Clue("hour_after", a, b))
    return [clue for clue in clues if clue.holds(solution)]


def _clues_for(solution: Grid, rng: random.Random) -> tuple[Clue, ...]:
    """A minimal set of true clues that leaves `solution` the only grid consistent with all of them."""
    n = len(solution[SUSPECT])
    pool = true_clues(solution)
    rng.shuffle(pool)
    pool.sort(key=lambda clue: rng.random() * KIND_WEIGHT[clue.kind])
    left, chosen = _everything(n), []
    for clue in pool:
        mask = _mask(clue, n)
        if left & mask != left:  # rules out at least one grid still possible
            chosen.append(clue)
            left &= mask
        if left.bit_count() == 1:
            break
    for clue in rng.sample(chosen, len(chosen)):  # drop what the others imply, in random order
        others = [c for c in chosen if c != clue]
        if functools.reduce(lambda m, c: m & _mask(c, n), others, _everything(n)).bit_count() == 1:
            chosen = others
    rng.shuffle(chosen)
    return tuple(chosen)


@functools.cache
def _everything(n: int) -> int:
    return (1 << len(all_grids(n))) - 1


@functools.cache
def _mask(clue: Clue, n: int) -> int:
    """The grids where `clue` holds, one bit per grid of `all_grids(n)`, built from `_same` bitsets."""
    if clue.kind in ("same", "not"):
        same = _same(clue.a, clue.b, n)
        return same if clue.kind == "same" else _everything(n) & ~same
    hours = range(n)
    if clue.kind == "earlier":
        pairs = [(i, j) for i in hours for j in hours if i < j]
    else:
        pairs = [(i + 1, i) for i in hours if i + 1 < n]
    return functools.reduce(
        lambda m, ij: m | (_same(clue.a, Fact(TIME, ij[0]), n) & _same(clue.b, Fact(TIME, ij[1]), n)), pairs, 0
    )


@functools.cache
def _same(a: Fact, b: Fact, n: int) -> int:
    """The grids where one person has both facts."""
    return functools.reduce(lambda m, p: m | (_has(a, p, n) & _has(b, p, n)), range(n), 0)


@functools.cache
def _has(fact: Fact, person: int, n: int) -> int:
    """The grids where `person` has `fact`."""
    bits = "".join("1" if grid[fact.category][person] == fact.value else "0" for grid in reversed(all_grids(n)))
    return int(bits, 2)


def describe(clue: Clue, names: tuple[tuple[str, ...], ...]) -> str:
    """The clue in English, e.g. "The person with the rope came earlier than Plum."."""
    a, b = clue.a, clue.b
    if clue.kind == "same":
        text = f"{_subject(a, names)} {_predicate(b, names)}"
    elif clue.kind == "not":
        text = f"{_subject(a, names)} {_predicate(b, names, negated=True)}"
    elif clue.kind == "earlier":
        text = f"{_subject(a, names)} came earlier than {_subject(b, names)}"
    else:
        text = f"{_subject(a, names)} came exactly one hour after {_subject(b, names)}"
    return text[0].upper() + text[1:] + "."


def _subject(fact: Fact, names: tuple[tuple[str, ...], ...]) -> str:
    name = names[fact.category][fact.value]
    return {
        SUSPECT: name,
        WEAPON: f"the person with the {name}",
        ROOM: f"the person who went to the {name}",
        TIME: f"the person who came at {name}",
    }[fact.category]


def _predicate(fact: Fact, names: tuple[tuple[str, ...], ...], *, negated: bool = False) -> str:
    name = names[fact.category][fact.value]
    positive, negative = {
        SUSPECT: (f"was {name}", f"was not {name}"),
        WEAPON: (f"carried the {name}", f"did not carry the {name}"),
        ROOM: (f"went to the {name}", f"did not go to the {name}"),
        TIME: (f"came at {name}", f"did not come at {name}"),
    }[fact.category]
    return negative if negated else positive


def _listing(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}"

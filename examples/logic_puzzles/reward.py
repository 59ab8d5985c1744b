"""The reward of a reply: parsed strictly from its last line, so that only a committed answer pays.

    ANSWER: <suspect>, <weapon>, <room>

The reply's last non-empty line (after any `<think>...</think>` block, which a reasoning model writes
first) must be exactly that: the `ANSWER:` prefix, three comma-separated fields, each field one name
from the puzzle's list for its place (case and surrounding spaces aside), and no other `ANSWER:` line
in the reply. Then each correct field earns a third. Anything else earns 0, so:

- several candidates in one field ("Plum or Scarlet", "Plum/Scarlet") name no single option: 0;
- several `ANSWER:` lines (hedging across lines) or an answer followed by more text: 0;
- the right names anywhere but the last line (echoing the clues, which name everyone): 0;
- a right name in the wrong place ("ANSWER: rope, Plum, hall"): 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

PREFIX = "ANSWER:"
THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)


@dataclass(frozen=True)
class Score:
    reward: float  # correct fields / 3 when well formed, else 0
    well_formed: bool
    fields_correct: tuple[bool, ...]  # per field (suspect, weapon, room); all False when not well formed

    @property
    def exact(self) -> bool:
        return self.well_formed and all(self.fields_correct)


def score(reply: str, options: Sequence[Sequence[str]], answer: Sequence[str]) -> Score:
    """Score `reply` against the right `answer`, one name per field, each among that field's `options`."""
    fields = parse_answer(reply, options)
    if fields is None:
        return Score(0.0, False, (False,) * len(answer))
    correct = tuple(given == right.casefold() for given, right in zip(fields, answer, strict=True))
    return Score(sum(correct) / len(correct), True, correct)


def parse_answer(reply: str, options: Sequence[Sequence[str]]) -> tuple[str, ...] | None:
    """The casefolded names of a well-formed final answer line, or None when there is none."""
    lines = [line.strip() for line in THINK.sub("", reply).splitlines() if line.strip()]
    if not lines or sum(line.startswith(PREFIX) for line in lines) != 1 or not lines[-1].startswith(PREFIX):
        return None
    fields = tuple(field.strip().casefold() for field in lines[-1].removeprefix(PREFIX).split(","))
    if len(fields) != len(options):
        return None
    known = all(field in {name.casefold() for name in names} for field, names in zip(fields, options, strict=True))
    return fields if known else None

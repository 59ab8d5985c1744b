"""A scripted LLM that plays AutoRL's generator and both of its judges, from the request it gets.

It writes the setup, numbered inputs (one marked EASY, which the judge scores flat so the
curriculum retires it), ranks RULER groups by position, and prefers the second answer of a pair.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from ruler_fixtures import answer, shown

TASK = "Translate short English phrases into natural French, keeping names unchanged."
PHRASES = ["the blue house", "a quiet morning", "my brother's car", "three green apples", "the last train home"]


class ScriptedAutoRL:
    def __init__(self, easy_first: bool = True) -> None:
        self.numbers = itertools.count()
        self.easy_pending = easy_first

    def __call__(self, body: dict[str, Any]) -> str:
        system = body["messages"][0]["content"]
        if system.startswith("You prepare reinforcement-learning training"):
            return json.dumps(
                {"system_prompt": "Translate the user's phrase into French. Answer with the translation only.",
                 "rubric": "- A correct, natural French translation scores highest.\n- Changed names are errors."}
            )  # fmt: skip
        if system.startswith("You write inputs"):
            count = int(re.search(r"exactly (\d+) items", body["messages"][-1]["content"]).group(1))  # type: ignore[union-attr]
            return json.dumps({"inputs": [self._input() for _ in range(count)]})
        if system.startswith("You compare two answers"):
            return json.dumps({"explanation": "the second reads better", "better": "2"})
        ids = [i for i, _ in shown(body)]
        if "EASY" in body["messages"][1]["content"]:
            return answer([(i, 1.0) for i in ids])  # every attempt equally good: no signal
        return answer([(i, round(1 - k / len(ids), 3)) for k, i in enumerate(ids)])

    def _input(self) -> dict[str, Any]:
        n = next(self.numbers)
        if self.easy_pending and n >= 2:  # not among the held-out inputs, which are written first
            self.easy_pending = False
            return {"input": f"EASY: say hello {n}", "difficulty": 1}
        return {"input": f"Translate: {PHRASES[n % len(PHRASES)]}, item {n}", "difficulty": 1 + n % 5}


def input_requests(requests: list[dict[str, Any]], steered: bool) -> int:
    """Input-generation requests; `steered` ones carry the curriculum's focus."""
    return sum(
        r["messages"][0]["content"].startswith("You write inputs")
        and ("does poorly" in r["messages"][1]["content"] or "already handles" in r["messages"][1]["content"])
        == steered
        for r in requests
    )

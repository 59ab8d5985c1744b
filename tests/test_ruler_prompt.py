"""RULER without a judge: prompt rendering, answer validation, pass orders, agreement."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections import Counter

import pytest
from ruler_fixtures import SYSTEM, conversation

from art_agents.messages import as_messages
from art_agents.ruler import (
    InvalidJudgement,
    common_prefix_length,
    kendall_tau,
    parse_judgement,
    pass_orders,
    render_judge_messages,
)
from art_agents.ruler.prompt import response_format

IDS = ["t1", "t2", "t3"]
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}


def test_shared_prefix_is_shown_once_and_each_remainder_once() -> None:
    lists = [conversation("What is 2 + 2?", q, turns=2) for q in (0.1, 0.5, 0.9)]
    prompt = render_judge_messages(lists, IDS, "be fair")[1]["content"]
    assert common_prefix_length([as_messages(m) for m in lists]) == 2
    assert prompt.count(SYSTEM.strip()) == 1
    assert prompt.count("What is 2 + 2?") == 1
    for q in (0.1, 0.5, 0.9):
        assert prompt.count(f"quality={q}") == 2  # two assistant turns each, none in the context
    full = render_judge_messages(lists, IDS, "be fair", dedup_prefix=False)[1]["content"]
    assert full.count(SYSTEM.strip()) == 3


def test_tools_shown_once_when_shared_and_per_trajectory_when_not() -> None:
    lists = [conversation("task", q) for q in (0.1, 0.2, 0.3)]
    shared = render_judge_messages(lists, IDS, "r", tools=[[TOOL]] * 3)[1]["content"]
    assert shared.count('"name": "add"') == 1
    other = {**TOOL, "function": {**TOOL["function"], "name": "mul"}}
    mixed = render_judge_messages(lists, IDS, "r", tools=[[TOOL], [other], None])[1]["content"]
    assert mixed.count('"name": "add"') == 1 and mixed.count('"name": "mul"') == 1
    assert mixed.index('"name": "mul"') > mixed.index('<trajectory id="t2">')
    full = render_judge_messages(lists, IDS, "r", tools=[[TOOL]] * 3, dedup_prefix=False)[1]["content"]
    assert full.count('"name": "add"') == 3


def test_order_changes_presentation_not_ids() -> None:
    lists = [conversation("task", q) for q in (0.1, 0.2, 0.3)]
    prompt = render_judge_messages(lists, IDS, "r", order=[2, 0, 1])[1]["content"]
    positions = [prompt.index(f'<trajectory id="{i}">') for i in ("t3", "t1", "t2")]
    assert positions == sorted(positions)
    assert prompt.index("quality=0.3") < prompt.index("quality=0.1")
    assert "rubric" not in prompt and "r" in render_judge_messages(lists, IDS, "r")[0]["content"]


def test_tool_calls_and_results_are_rendered() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
    base = [{"role": "user", "content": "2+2?"}]
    lists = [
        [*base, {"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "4"}],
        [*base, {"role": "assistant", "content": "5"}],
    ]
    prompt = render_judge_messages(lists, ["t1", "t2"], "r")[1]["content"]
    assert '"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 2}"' in prompt
    assert '{"role": "tool", "tool_call_id": "c1", "content": "4"}' in prompt


def test_response_format_constrains_ids_count_and_range() -> None:
    schema = response_format(IDS)["json_schema"]["schema"]
    items = schema["properties"]["scores"]
    assert items["minItems"] == items["maxItems"] == 3
    assert items["items"]["properties"]["trajectory_id"]["enum"] == IDS
    assert items["items"]["properties"]["score"] == {"type": "number", "minimum": 0, "maximum": 1}


def _answer(*entries: tuple[str, object]) -> str:
    return json.dumps({"scores": [{"trajectory_id": i, "explanation": "x", "score": s} for i, s in entries]})


def test_valid_answers_parse_including_fenced_and_chatty_ones() -> None:
    text = _answer(("t2", 0.5), ("t1", 1), ("t3", "0.25"))
    assert {i: s.score for i, s in parse_judgement(text, IDS).items()} == {"t1": 1.0, "t2": 0.5, "t3": 0.25}
    assert parse_judgement(f"Sure!\n```json\n{text}\n```", IDS)["t2"].score == 0.5
    assert parse_judgement(f"Here you go: {text} Hope it helps.", IDS)["t3"].score == 0.25


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"scores": [{"trajectory_id": "t1", "score": 0.5', "not valid JSON"),
        ("", "the answer was empty"),
        (_answer(("t1", 0.1), ("t2", 0.2)), "no score for t3"),
        (_answer(("t1", 0.1), ("t2", 0.2), ("t2", 0.3), ("t3", 0.4)), "trajectory t2 is scored more than once"),
        (_answer(("t1", 0.1), ("t2", 0.2), ("t3", 0.4), ("t9", 0.4)), "'t9', which is not one of the ids shown"),
        (_answer(("t1", 7), ("t2", 0.2), ("t3", 0.4)), "trajectory t1 has score 7, outside the range [0, 1]"),
        (_answer(("t1", True), ("t2", 0.2), ("t3", 0.4)), "trajectory t1 has score True, which is not a number"),
        ('["no"]', "scores[0] is not an object; no score for t1, t2, t3"),
        ('{"verdict": "good"}', 'must be an object {"scores": [...]}'),
    ],
)
def test_invalid_answers_name_the_problem(text: str, problem: str) -> None:
    with pytest.raises(InvalidJudgement) as error:
        parse_judgement(text, IDS)
    assert problem in str(error.value)


def test_pass_orders_start_as_given_then_reversed_then_seeded() -> None:
    orders = pass_orders(5, 4)
    assert orders[0] == [0, 1, 2, 3, 4] and orders[1] == [4, 3, 2, 1, 0]
    assert sorted(orders[2]) == sorted(orders[3]) == list(range(5))
    assert pass_orders(5, 4) == orders  # deterministic, so reruns hit the cache
    with pytest.raises(ValueError, match="passes must be at least 1"):
        pass_orders(3, 0)


def test_kendall_tau() -> None:
    assert kendall_tau([0.1, 0.5, 0.9], [0.2, 0.3, 1.0]) == 1.0
    assert kendall_tau([0.1, 0.5, 0.9], [0.9, 0.5, 0.1]) == -1.0
    assert kendall_tau([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]) == 1.0
    assert kendall_tau([0.5, 0.5, 0.5], [0.1, 0.2, 0.3]) == 0.0
    assert kendall_tau([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(4 / 6)
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / (2 * 3) ** 0.5)


def test_kendall_tau_matches_scipy_and_the_tie_group_formula() -> None:
    # scipy.stats.kendalltau's docstring example (ties in both lists): -0.47140452079103173
    assert kendall_tau([12, 2, 1, 12, 2], [1, 4, 7, 1, 0]) == pytest.approx(-0.47140452079103173, abs=1e-12)

    def tie_group_formula(a: list[int], b: list[int]) -> float:
        """tau-b = (n_c - n_d) / sqrt((n0 - n1)(n0 - n2)), n1 and n2 summing t(t-1)/2 over each list's tie groups."""
        n0 = len(a) * (len(a) - 1) / 2
        n1, n2 = (sum(t * (t - 1) / 2 for t in Counter(x).values()) for x in (a, b))
        signs = sum(
            ((a[i] > a[j]) - (a[i] < a[j])) * ((b[i] > b[j]) - (b[i] < b[j]))
            for i in range(len(a))
            for j in range(i + 1, len(a))
        )
        return signs / math.sqrt((n0 - n1) * (n0 - n2))

    rng = random.Random(0)
    for size in (rng.randint(2, 12) for _ in range(200)):
        a, b = [rng.randint(0, 3) for _ in range(size)], [rng.randint(0, 3) for _ in range(size)]
        if len(set(a)) > 1 and len(set(b)) > 1:  # all ties on one side: the formula divides by zero
            assert kendall_tau(a, b) == pytest.approx(tie_group_formula(a, b), abs=1e-12)


def test_importing_ruler_does_not_import_litellm() -> None:
    code = "import sys, art_agents.ruler; print('litellm' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"

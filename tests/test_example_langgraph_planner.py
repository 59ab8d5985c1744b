"""examples/langgraph_planner: exact answers, a reward only the right number earns, the graph, and the script.

The problems' answers are recomputed here from the question text, so a generator bug cannot hide behind the code
it would share with the check. The reward's parsing is checked case by case (what earns, and the format tricks
that earn nothing). The graph runs through the wrapper against the real server with the scripted engine (a random
model never calls a tool), so the tool loop, the node names and the reward are checked end to end; the slow test
runs the script as CI does (`--tiny`), so the example cannot rot.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from types import ModuleType

import pytest
from server_fixtures import hermes

from art_agents import ModelConfig, TrainableModel, TrainConfig, TrajectoryGroup, read_groups

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "langgraph_planner"


def load_example() -> ModuleType:
    """`examples/langgraph_planner/train.py` (a script, not a package) as a module."""
    spec = importlib.util.spec_from_file_location("langgraph_planner_train", EXAMPLE / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


example = load_example()


def recomputed(kind: str, question: str) -> float:
    """The answer worked out again from the question's own numbers, in floats."""
    n = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", question)]
    return {
        "speed": lambda: n[0] * n[1] / 60 * 1000,  # km/h x minutes -> metres
        "flour": lambda: n[0] * n[1] * n[2] / 1000,  # g x loaves x days -> kg
        "bottles": lambda: (n[0] * n[1] - n[3]) * n[2] / 1000,  # (crates x bottles - broken) x mL -> L
        "shelves": lambda: n[0] * (n[1] * 12 + n[2]) * 2.54,  # shelves x (feet and inches) -> cm
        "change": lambda: n[4] - (n[2] * n[0] + n[3] * n[1]),  # note - (notebooks + pens), dollars
    }[kind]()


def test_every_generated_answer_is_right_and_exact() -> None:
    problems = example.make_problems(200, seed=3)
    assert {p.kind for p in problems} == {"speed", "flour", "bottles", "shelves", "change"}
    for problem in problems:
        assert float(problem.answer) == pytest.approx(recomputed(problem.kind, problem.question), abs=1e-9)
        assert problem.answer > 0
        written = example.format_number(problem.answer)  # a terminating decimal, so the exact answer can be written
        assert Fraction(written) == problem.answer
        assert example.is_correct(example.parse_answer(f"ANSWER: {written}"), problem.answer)


def test_a_few_answers_by_hand() -> None:
    worked = {
        "A cyclist rides at 30 km/h for 147 minutes. How many metres does she cover?": Fraction(73500),
        "A bookcase has 9 shelves, each 7 feet 10 inches long. How many centimetres of shelf is that in total?": (
            Fraction("2148.84")
        ),
    }
    found = {p.question: p.answer for p in example.make_problems(10, seed=0) if p.question in worked}
    assert found == worked


def test_problems_are_distinct_reproducible_and_held_out_ones_never_train() -> None:
    held_out = example.make_problems(50, seed=10_000)
    train = example.make_problems(500, seed=0, exclude=(p.question for p in held_out))
    assert len({p.question for p in train}) == 500
    assert not {p.question for p in train} & {p.question for p in held_out}
    assert example.make_problems(20, seed=0) == example.make_problems(20, seed=0)
    assert example.make_problems(20, seed=0) != example.make_problems(20, seed=1)


@pytest.mark.parametrize(
    ("reply", "value"),
    [
        ("1. 20 km/h is 20000 m per hour.\n2. 78 minutes is 1.3 h.\nANSWER: 26000", Fraction(26000)),
        ("ANSWER: 26000 m", Fraction(26000)),
        ("ANSWER: 26,000", Fraction(26000)),
        ("ANSWER: $3.89.", Fraction("3.89")),
        ("ANSWER: 203.2\n\n", Fraction("203.2")),
        ("ANSWER: 5\nANSWER: 26000", Fraction(26000)),  # only the last line counts
        ("ANSWER: 26000\nI hope that helps!", None),  # not the last line
        ("The answer is 26000.", None),  # the right number outside the format
        ("ANSWER: 26000 or 26001", None),  # two candidates
        ("ANSWER: 26000, 26001", None),
        ("ANSWER: 20 * 1300", None),  # an expression, not a number
        ("ANSWER: 2,60,00", None),  # commas in the wrong places
        ("answer: 26000", None),
        ("**ANSWER: 26000**", None),
        ("ANSWER:", None),
        ("", None),
    ],
)
def test_only_an_exact_answer_line_is_read(reply: str, value: Fraction | None) -> None:
    assert example.parse_answer(reply) == value


def test_tolerance_is_for_round_off_only() -> None:
    answer = Fraction(26000)
    assert example.is_correct(Fraction("26000.0000001"), answer)
    assert not example.is_correct(Fraction("26000.1"), answer) and not example.is_correct(Fraction(26001), answer)
    assert example.is_correct(Fraction("3.89"), Fraction("3.89")) and not example.is_correct(
        Fraction("3.9"), Fraction("3.89")
    )
    assert not example.is_correct(None, answer)


def test_a_wrong_answer_never_reaches_a_right_one() -> None:
    worst_right, best_wrong = example.reward(True, 10**9), example.reward(False, 0)
    assert worst_right == pytest.approx(0.9) and best_wrong == 0.0
    assert example.reward(True, 400) == pytest.approx(0.99) and example.reward(False, 400) == pytest.approx(-0.01)


def test_the_tools_compute_exactly_and_refuse_anything_else() -> None:
    assert example.calculator("(12 * 30 + 5) / 4") == "91.25"
    assert example.calculator("0.1 + 0.2") == "0.3"  # exact, not 0.30000000000000004
    assert example.calculator("1 / 3") == "0.333333"
    assert example.calculator("1 / 0") == "error: division by zero"
    assert example.calculator("2 ** 100").startswith("error: unsupported")
    assert example.calculator("__import__('os').system('true')").startswith("error: unsupported")
    assert example.convert(2.5, "km", "m") == "2500 m"
    assert example.convert(6, "feet", "cm") == "182.88 cm"
    assert example.convert(90, "minutes", "hours") == "1.5 hours"
    assert example.convert(1500, "mL", "L") == "1.5 L"
    assert example.convert(1, "kg", "L").startswith("error: cannot convert mass")
    assert example.convert(1, "parsec", "m").startswith("error: unknown unit 'parsec'")


def test_options_default_to_a_real_model_and_tiny_shrinks_them() -> None:
    full, tiny = example.parse_args([]), example.parse_args(["--tiny", "--steps", "1"])
    assert (full.base_model, full.steps, full.group_size) == ("Qwen/Qwen3-0.6B", 20, 8)
    assert (tiny.steps, tiny.problems_per_step, tiny.group_size, tiny.max_tokens) == (1, 2, 3, 12)


# --- the graph through the wrapper, against the real server (scripted engine) ----------------------

PROBLEM = example.Problem(
    "A cyclist rides at 20 km/h for 78 minutes. How many metres does she cover?", Fraction(26000), "speed"
)


PLAN = "1. Convert 78 minutes to hours.\n2. Multiply by 20 km/h.\n3. Convert km to m."
CALL = hermes("calculator", expression="20 * 1000 * 78 / 60")
FINAL = "20 km/h for 1.3 h is 26 km.\nANSWER: 26000"


async def test_planner_worker_and_tools_are_captured_scored_and_trained(backend, tiny_model_path) -> None:
    # two rollouts in turn: plan, calculator call, answer; the second answers wrong
    script = [PLAN, CALL, FINAL, PLAN, CALL, "ANSWER: 26"]
    config = ModelConfig(engine="scripted", scripted_responses=script)
    model = TrainableModel(name="planner", project="tests", base_model=str(tiny_model_path), config=config)
    await model.register(backend)
    agent = example.wrap(example.build_graph(model.chat_model(temperature=1.0)), model=model)
    right = await agent.rollout(example.graph_input(PROBLEM), reward=example.grader(PROBLEM))
    wrong = await agent.rollout(example.graph_input(PROBLEM), reward=example.grader(PROBLEM))

    assert [turn.span for turn in right.turns] == ["planner", "worker", "worker"]
    assert [(call.name, call.result, call.span) for call in right.tool_calls] == [("calculator", "26000", "tools")]
    planner, worker = right.histories()
    assert [m.role for m in planner.messages] == ["system", "user", "assistant"] and planner.messages[2].content == PLAN
    assert [m.role for m in worker.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert PLAN in worker.messages[1].text()  # the worker is briefed with the planner's plan
    assert right.metrics == {
        "correct": True,
        "answered": True,
        "chars_written": len(PLAN) + len('{"expression": "20 * 1000 * 78 / 60"}') + len(FINAL),
        "planner_calls": 1,
        "worker_calls": 2,
        "tool_calls": 1,
    }
    assert right.reward == pytest.approx(1 - 0.1 * right.metrics["chars_written"] / 4000)
    assert wrong.metrics["correct"] is False and wrong.metrics["answered"] is True and wrong.reward < 0

    result = await model.train([TrajectoryGroup([right, wrong])], TrainConfig(scale_rewards=False), progress=False)
    assert result.step == 1 and result.metrics["turns_from_store"] == 6 and result.metrics["turns_retokenized"] == 0


async def test_the_worker_stops_after_its_last_call(backend, tiny_model_path) -> None:
    config = ModelConfig(engine="scripted", scripted_responses=[PLAN] + [CALL] * example.MAX_WORKER_CALLS)
    model = TrainableModel(name="looping", project="tests", base_model=str(tiny_model_path), config=config)
    await model.register(backend)
    agent = example.wrap(example.build_graph(model.chat_model()), model=model)
    looping = await agent.rollout(example.graph_input(PROBLEM), reward=example.grader(PROBLEM))
    assert looping.metrics["worker_calls"] == example.MAX_WORKER_CALLS
    assert looping.metrics["tool_calls"] == example.MAX_WORKER_CALLS - 1 and looping.metrics["answered"] is False


# --- the script, as CI runs it ---------------------------------------------------------------------


@pytest.mark.slow  # the whole script on the tiny model; CI runs it with -m slow
def test_the_script_runs_on_the_tiny_model(tmp_path: Path) -> None:
    command = [sys.executable, str(EXAMPLE / "train.py"), "--tiny", "--art-path", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "langgraph-planner" / "models" / "planner-worker-tiny"
    assert re.search(r"held-out accuracy: \d/4 \(\d+%\) at step 0 -> \d/4 \(\d+%\) at step \d", done.stdout)
    assert "model calls per rollout over 20 rollouts: planner 1.00, worker " in done.stdout
    assert f"run folder: {run}" in done.stdout

    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    trained = [row["step"] for row in rows if row.get("kind") == "rl"]
    evaluated = [row["step"] for row in rows if row.get("split") == "val"]
    assert trained and evaluated == [0, max(trained)]
    assert all("val/correct" in row["metrics"] for row in rows if row.get("split") == "val")

    files = sorted((run / "trajectories").glob("*/*.jsonl"))
    assert {path.parent.name for path in files} == {"train", "val"}
    for path in files:
        for trajectory in (t for group in read_groups(path) for t in group.trajectories):
            assert {turn.span for turn in trajectory.turns} >= {"planner", "worker"}, path
            assert all(turn.completion_id and turn.policy_step is not None for turn in trajectory.turns)

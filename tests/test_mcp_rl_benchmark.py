"""benchmarks/mcp_rl.py: tasks carry right answers, the reward checks them, and the script runs on the tiny model."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from benchmark_scripts import load_benchmark

from art_agents import Trajectory

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "mcp_rl.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("mcp_rl")


def test_scenarios_are_fixed_disjoint_and_answered(bench: ModuleType) -> None:
    scenarios = [task.scenario for task in bench.TASK_SETS["calculator"].solved(40, 10)]
    assert scenarios == [task.scenario for task in bench.TASK_SETS["calculator"].solved(40, 10)]
    assert sum(s.split == "val" for s in scenarios) == 10 and len({s.task for s in scenarios}) == 40
    product = next(s for s in scenarios if s.task.startswith("What is ") and " * " in s.task)
    a, b = (int(x) for x in product.task.removeprefix("What is ").rstrip("?").split(" * "))
    assert product.reference_answer == str(a * b)


def test_the_shop_tasks_are_answered_by_their_query_and_the_shop_cannot_be_changed(
    bench: ModuleType, tmp_path: Path
) -> None:
    import contextlib
    import sqlite3

    tasks = bench.TASK_SETS["sqlite"].solved(60, 20)
    assert len({t.scenario.task for t in tasks}) == 60 and sum(t.scenario.split == "val" for t in tasks) == 20
    path = sys.modules["mcp_tasks"].shop_database(tmp_path)
    with contextlib.closing(sqlite3.connect(path)) as db:
        for task in tasks:
            (answer,) = db.execute(task.arguments["query"]).fetchone()
            assert task.tool == "read_query" and float(task.scenario.reference_answer) == answer
        with pytest.raises(sqlite3.IntegrityError, match="read-only"):
            db.execute("DELETE FROM orders")
        db.execute("DROP TABLE orders")
        db.commit()
    assert bench.TASK_SETS["sqlite"].reset(tmp_path) and not bench.TASK_SETS["sqlite"].reset(tmp_path)
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT COUNT(*) FROM orders").fetchone() == (60,)


def test_the_teacher_calls_the_solving_tool_then_answers_with_its_result(bench: ModuleType) -> None:
    (task, *_) = bench.TASK_SETS["sqlite"].solved(5, 1)
    teacher = bench.Teacher([task])
    messages = [{"role": "system", "content": "..."}, {"role": "user", "content": task.scenario.task}]
    (call,) = teacher.reply({"messages": messages})["tool_calls"]
    assert call["function"] == {"name": "read_query", "arguments": json.dumps(task.arguments)}
    messages += [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "[{'COUNT(*)': 12}]"}]
    (done,) = teacher.reply({"messages": messages})["tool_calls"]
    assert done["function"] == {"name": "complete_task", "arguments": json.dumps({"answer": "12"})}


@pytest.mark.parametrize(
    ("answer", "calls", "errors", "shaped", "strict"),
    [
        ("The answer is 10,063.", 1, 0, 1.0, 1.0),  # right: the one number, commas ignored
        ("10063", 0, 0, 1.0, 1.0),  # right without the tool still counts as task success
        ("347 * 29 = 10063", 1, 0, 0.3, 0.0),  # several numbers: not an answer
        ("(10063) * 29", 1, 0, 0.3, 0.0),  # even when the first one is right
        ("(10063)", 1, 0, 1.0, 1.0),
        ("10064", 1, 0, 0.3, 0.0),  # a calculator call that ran
        ("10064", 2, 2, 0.1, 0.0),  # only failing calls (unknown tool, bad arguments)
        ("<tool_call>{bad json", 0, 0, 0.05, 0.0),  # tried the format and missed
        (None, 0, 0, 0.0, 0.0),
    ],
)
def test_reward_checks_the_final_answer(
    bench: ModuleType, answer: str | None, calls: int, errors: int, shaped: float, strict: float
) -> None:
    scenario = bench.Scenario(id="x", split="val", task="What is 347 * 29?", difficulty=1, reference_answer="10063")
    malformed = int("<tool_call>" in (answer or ""))
    metrics = {"tool_calls": calls, "tool_errors": errors, "malformed_tool_calls": malformed}
    trajectory = Trajectory(metadata={"answer": answer}, metrics=metrics)
    assert bench.reward(scenario, trajectory) == shaped
    assert bench.reward(scenario, trajectory, shaping=False) == strict


@pytest.mark.slow  # a whole run on the tiny model; CI runs it with -m slow
@pytest.mark.parametrize(("curriculum", "guide"), [("uniform", False), ("failures", False), ("failures", True)])
def test_one_step_on_the_tiny_model(tmp_path: Path, curriculum: str, guide: bool) -> None:
    out, scratch = tmp_path / "result.json", tmp_path / "tmp"
    scratch.mkdir()
    command = [
        sys.executable, str(SCRIPT), "--tiny", "--steps", "1", "--eval-limit", "3", "--groups-per-step", "2",
        "--group-size", "2", "--max-tokens", "8", "--lora-rank", "4", "--result", str(out),
        "--curriculum", curriculum, "--lr", "2e-4", *(["--guide"] if guide else []),
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(scratch)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "task success" in done.stdout and "valid tool call" in done.stdout
    summary = json.loads(out.read_text())
    assert summary["settings"]["curriculum"] == curriculum and summary["settings"]["lr"] == 2e-4
    assert summary["guided"] == [2 if guide else 0]  # the tiny model solves nothing: the teacher guides both groups
    assert summary["draws"] == 1 and len(summary["before"]["items"]) == len(summary["after"]["items"]) == 3
    phases = ("load", "base_evaluation", "rollouts", "training", "final_evaluation", "other", "wall")
    assert tuple(summary["phases"]) == phases and "seconds by phase: load " in done.stdout  # RL only: no SFT
    row = summary["rows"]["task success"]
    assert row["ci"][0] <= row["diff"] <= row["ci"][1]
    assert not list(scratch.glob("art-*"))  # the temporary art path (tiny model, checkpoints) is removed


def test_the_failures_curriculum_drops_solved_tasks_and_keeps_groups_with_a_signal(bench: ModuleType) -> None:
    from art_agents import TrajectoryGroup

    train = [task.scenario for task in bench.TASK_SETS["calculator"].solved(12, 2)][2:]

    def group(scenario: object, *rewards: float) -> TrajectoryGroup:
        return TrajectoryGroup(Trajectory(reward=r, metadata={"scenario_id": scenario.id}) for r in rewards)

    uniform = bench.Draws(train, "uniform", seed=0)
    assert [s.id for s in uniform.sample(4)] == [s.id for s in random.Random(0).sample(train, 4)]

    draws = bench.Draws(train, "failures", seed=0)
    solved, tied_wrong, mixed = train[:3]
    signal = draws.observe([group(solved, 1, 1, 1, 1), group(tied_wrong, 0.3, 0.3, 0.3, 0.3), group(mixed, 1, 0.3)])
    assert [bench.group_task(g) for g in signal] == [mixed.id]  # tied groups carry no signal
    assert draws.solved == {solved.id} and solved not in draws.pool() and tied_wrong in draws.pool()
    for _ in range(20):  # a solved task is never drawn again; fresh tasks avoid those already rolled this draw
        picked = draws.sample(3, exclude={mixed.id})
        assert solved not in picked and mixed not in picked and len({s.id for s in picked}) == 3
    draws.observe([group(s, 1, 1) for s in train])  # all solved: draws go on over every task
    assert len(draws.pool()) == len(train) and len(draws.sample(4)) == 4


def test_the_servers_own_error_messages_count_as_errors_and_empty_results_earn_less(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from art_agents.trajectory import ToolCallRecord

    results = {  # mcp-server-sqlite answers a failing query with text, not with MCP's isError
        "[{'COUNT(*)': 4}]": (0, 0, 0.3),
        "[{'SUM(quantity)': None}]": (0, 1, 0.2),
        "[]": (0, 1, 0.2),
        "Database error: no such column: name": (1, 0, 0.1),
        "Error: Only SELECT queries are allowed for read_query": (1, 0, 0.1),
    }
    scenario = bench.Scenario(id="x", split="val", task="How many?", difficulty=1, reference_answer="7")
    for text, (refused, empty, shaped) in results.items():

        async def rolled(*_: object, text: str = text) -> Trajectory:
            record = ToolCallRecord(name="read_query", arguments={"query": "SELECT"}, result=text)
            metrics = {"tool_calls": 1, "tool_errors": 0, "malformed_tool_calls": 0}
            return Trajectory(metadata={"answer": "4"}, metrics=metrics, tool_calls=[record])

        monkeypatch.setattr(sys.modules[bench.server_rollout.__module__], "library_rollout", rolled)  # mcp_rl_rollouts
        trajectory = asyncio.run(bench.server_rollout(None, scenario, None, None))
        assert trajectory.metrics["tool_errors"] == trajectory.metrics["server_error_results"] == refused, text
        assert trajectory.metrics["empty_results"] == empty, text
        assert bench.reward(scenario, trajectory) == shaped, text
        assert bench.valid(trajectory.metrics) == 1 - refused

"""examples/any_agent: an Anthropic SDK agent and an OpenAI Agents SDK agent, each trained through its own
protocol with only its base URL changed, then evaluated on held-out questions. The slow tests run each script
as CI does (`--tiny`), so the examples cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "any_agent"


def test_held_out_questions_never_appear_in_training() -> None:
    sys.path.insert(0, str(EXAMPLE))
    from arithmetic import questions, reward

    train = questions(0, 64)
    held_out = questions(10_000, 40, exclude=train)
    assert not {q["question"] for q in train} & {q["question"] for q in held_out}
    scenario = {"answer": 57}
    assert reward("The sum is 57.", scenario) == 1.0 and reward(None, scenario) == 0.0
    assert reward("5", scenario) == 0.125  # a digit of the sum: a little credit, so attempts differ


@pytest.mark.slow  # a whole run on the tiny model; CI runs it with -m slow
@pytest.mark.parametrize(
    ("script", "name"),
    [("anthropic_sdk.py", "tiny-anthropic-adder"), ("openai_agents_sdk.py", "tiny-agents-sdk-adder")],
)
def test_the_tiny_run_trains_through_the_sdk_and_evaluates(tmp_path: Path, script: str, name: str) -> None:
    command = [sys.executable, str(EXAMPLE / script), "--tiny", "--art-path", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    folder = tmp_path / "any-agent" / "models" / name
    rows = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if row.get("split") is None] == [1]
    trained = next(row for row in rows if row.get("split") is None)
    assert trained["metrics"]["turns_retokenized"] == 0 and trained["metrics"]["turns_from_store"] > 0
    summary = json.loads((folder / "eval" / "heldout" / "summary.json").read_text())
    assert [m["model"] for m in summary["models"]] == [f"{name}@0", f"{name}@1"]
    assert all(m["scenarios"] == 4 and m["failed_rollouts"] == 0 for m in summary["models"])
    assert f"{name}@1 - {name}@0:" in done.stdout

"""`art-agents autorl` end to end on CPU: the tiny model, a scripted generator and judges through
LiteLLM; interrupted with SIGINT, then killed with SIGKILL, then rerun to finish at the right step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from autorl_fixtures import TASK, ScriptedAutoRL, input_requests
from scripted_openai import ScriptedOpenAI
from test_eval_run_folder import comparable

from art_agents.evaluation.files import EvalSummary


def command(url: str, tiny_model_path: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "art_agents", "autorl", "--task", TASK,
        "--base-model", str(tiny_model_path),
        "--judge-model", "openai/judge", "--judge-api-base", url, "--judge-api-key", "sk-test",
        "--steps", "3", "--group-size", "2", "--groups-per-step", "2", "--inputs", "4", "--eval-inputs", "2",
        "--eval-every", "2", "--retire-after", "1", "--max-tokens", "8", "--out", str(out), *extra,
    ]  # fmt: skip


def environment(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ART_AGENTS_RULER_CACHE": str(tmp_path / "ruler-cache"), "PYTHONUNBUFFERED": "1"}


def wait_for(path: Path, process: subprocess.Popen[str], timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"no {path} within {timeout_s} s"
        time.sleep(0.2)


def wait_for_rows(path: Path, rows: int, process: subprocess.Popen[str], timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or len(path.read_text().splitlines()) < rows:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"fewer than {rows} rows in {path} within {timeout_s} s"
        time.sleep(0.2)


def processes_using(path: Path) -> list[int]:
    """Pids whose command line names `path` (the run's server), so a test can wait for none to be left."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.timeout(500)
@pytest.mark.slow  # a whole run on the tiny model; CI runs it with -m slow
def test_autorl_runs_survives_sigint_and_sigkill_and_finishes_at_the_right_step(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    models = out / "art" / "autorl" / "models" / "autorl-agent"
    env = environment(tmp_path)
    with ScriptedOpenAI(delay_s=0.1) as server:
        server.default = ScriptedAutoRL()
        argv = command(server.base_url, tiny_model_path, out)

        first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(models / "checkpoints" / "0001", first)
        first.send_signal(signal.SIGINT)
        _, stderr = first.communicate(timeout=60)
        assert first.returncode in (0, 130), stderr
        if first.returncode == 130:
            assert "Rerun the same command to continue" in stderr and "Traceback" not in stderr
        generated = {name: (out / name).read_text() for name in ("eval.jsonl", "rubric.md", "system_prompt.md")}
        assert json.loads((out / "task.json").read_text())["task"] == TASK
        assert len((out / "eval" / "heldout" / "autorl-agent@0.jsonl").read_text().splitlines()) == 2

        second = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # killed once step 2 is logged (during its evaluation or step 3): a kill between the pool's write and
        # the step's row loses that row, a known gap (the two files are not written atomically)
        wait_for_rows(out / "steps.jsonl", 2, second)
        second.kill()
        second.communicate(timeout=60)
        deadline = time.monotonic() + 60
        while processes_using(out / "art"):  # its server notices the dead parent and exits
            assert time.monotonic() < deadline, "the killed run's server is still running"
            time.sleep(0.5)

        third = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert third.returncode == 0, third.stderr
        assert "resuming the run" in third.stdout and "reusing 2 held-out inputs" in third.stdout
        assert {name: (out / name).read_text() for name in generated} == generated
        assert input_requests(server.requests, steered=False) == 2  # held-out and training inputs, once each
        setups = [r for r in server.requests if r["messages"][0]["content"].startswith("You prepare")]
        assert len(setups) == 1
        again = tmp_path / "again"  # `art-agents eval RUN_FOLDER`, no flag: the judge's key from the environment
        evaluated = subprocess.run(
            [sys.executable, "-m", "art_agents", "eval", str(out), "--out", str(again)],
            env={**env, "OPENAI_API_KEY": "sk-test"}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert evaluated.returncode == 0, evaluated.stderr

    def rows(folder: Path) -> tuple[list[list[str]], list[list[str]]]:
        return comparable(EvalSummary.model_validate_json((folder / "eval" / "heldout" / "summary.json").read_text()))

    assert rows(again) == rows(out)  # greedy: the same table as the run's own, seconds apart

    history = [json.loads(line) for line in (models / "history.jsonl").read_text().splitlines()]
    assert [row["step"] for row in history] == [1, 2, 3]  # no step trained twice, none skipped
    summary = json.loads((out / "summary.json").read_text())
    evaluation = summary["evaluation"]
    assert summary["step"] == 3 and [m["step"] for m in evaluation["models"]] == [0, 3]
    (pair,) = evaluation["comparisons"]
    versus = pair["judged"]  # RULER's rewards are relative: the answers judged side by side against the base's
    assert pair["baseline"] == "autorl-agent@0" and versus["wins"] + versus["losses"] + versus["ties"] == 2
    assert 0 <= versus["win_rate"] <= 1
    assert len((out / "eval" / "heldout" / "autorl-agent@2.jsonl").read_text().splitlines()) == 2  # eval_every
    assert "win rate vs base" in third.stdout and "judge score" in third.stdout
    assert "evaluation heldout: pairs" in third.stdout

    pool = [json.loads(line) for line in (out / "inputs.jsonl").read_text().splitlines()]
    retired = [p for p in pool if p["retired_at_step"] is not None]
    assert [p["input"].startswith("EASY") for p in retired] == [True]  # the flat one, and only it
    added = [p for p in pool if p["added_at_step"] > 0]
    assert len(added) == 1 and len(pool) == 5 and input_requests(server.requests, steered=True) >= 1
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert sum(r["retired"] for r in rows) >= 1 and sum(r["added"] for r in rows) >= 1
    # the scripted endpoint bills 10 prompt tokens per call: every train call paid for its judging
    assert all(r["judge_prompt_tokens"] > 0 and r["judge_prompt_tokens"] % 10 == 0 for r in rows)
    assert any(r["generator_prompt_tokens"] == 10 for r in rows)  # the replacement inputs
    assert not any(r["judge_cost_known"] or r["generator_cost_known"] for r in rows)  # no price, not $0
    assert summary["judge_cost_known"] is False
    generation = json.loads((out / "generation.json").read_text())  # a request the kill cut off is not in it
    assert 3 + 1 <= generation["calls"] <= 3 + input_requests(server.requests, steered=True)

"""`art-agents mcp-rl` end to end on CPU: the tiny model, `mcp-server-time` over stdio, a scripted
generator and judge through LiteLLM; interrupted with SIGINT, then rerun to finish at the right step.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ruler_fixtures import answer, shown
from scripted_openai import ScriptedOpenAI

TASKS = [
    "What time is it now in Tokyo?",
    "Convert 09:30 in London to the time in New York.",
    "Which weekday is it right now in Sydney?",
    "Is it already afternoon in Berlin?",
    "What is the time difference between Paris and Los Angeles?",
    "Convert 18:00 in Madrid to the time in Singapore.",
    "What is the current date in Honolulu?",
    "Tell me the time in UTC right now.",
]


def generator_or_judge(body: dict[str, Any]) -> str:
    """Writes scenarios when asked for them, else judges: the first trajectory shown scores best, and of two answers
    side by side the second is better."""
    if body["messages"][0]["content"].startswith("You compare two answers"):
        return json.dumps({"explanation": "the second reads better", "better": "2"})
    asked = re.search(r"exactly (\d+) items", body["messages"][-1]["content"])
    if asked and "training tasks" in body["messages"][0]["content"]:
        count = int(asked.group(1))
        return json.dumps({"scenarios": [{"task": t, "difficulty": 2} for t in TASKS[:count]]})
    ids = [i for i, _ in shown(body)]
    return answer([(i, round(1 - k / len(ids), 3)) for k, i in enumerate(ids)])


def command(url: str, tiny_model_path: Path, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "art_agents", "mcp-rl",
        "--server", f"{sys.executable} -m mcp_server_time",
        "--base-model", str(tiny_model_path),
        "--judge-model", "openai/judge", "--judge-api-base", url, "--judge-api-key", "sk-test",
        "--generator-model", "openai/generator", "--generator-api-base", url, "--generator-api-key", "sk-test",
        "--steps", "2", "--group-size", "2", "--groups-per-step", "2",
        "--scenarios", "4", "--val-scenarios", "2", "--max-turns", "2", "--max-tokens", "8",
        "--out", str(out),
    ]  # fmt: skip


def generator_requests(server: ScriptedOpenAI) -> int:
    return sum("training tasks" in r["messages"][0]["content"] for r in server.requests)


@pytest.mark.timeout(400)
@pytest.mark.slow  # a whole run on the tiny model; CI runs it with -m slow
def test_mcp_rl_runs_is_interrupted_and_resumes_at_the_right_step(tiny_model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "ART_AGENTS_RULER_CACHE": str(tmp_path / "ruler-cache"), "PYTHONUNBUFFERED": "1"}
    with ScriptedOpenAI(delay_s=0.2) as server:
        server.default = generator_or_judge
        argv = [*command(server.base_url, tiny_model_path, out), "--pipeline"]  # interrupted while pipelined
        checkpoints = out / "art" / "mcp-rl" / "models" / "mcp-agent" / "checkpoints"

        first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 240
        while not (checkpoints / "0001").is_dir():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "no checkpoint 1 within 240 s"
            time.sleep(0.2)
        first.send_signal(signal.SIGINT)
        first_stdout, stderr = first.communicate(timeout=60)
        assert first.returncode in (0, 130), stderr
        if first.returncode == 130:  # caught during step 2 (it may also have just finished)
            assert "Rerun the same command to continue" in stderr and "Traceback" not in stderr
        scenarios = (out / "scenarios.jsonl").read_text().splitlines()
        assert len(scenarios) == 6 and generator_requests(server) == 1
        assert len((out / "eval" / "heldout" / "mcp-agent@0.jsonl").read_text().splitlines()) == 2

        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        assert "reusing 6 scenarios" in second.stdout and "resuming the run" in second.stdout
        printed = first_stdout + second.stdout  # each step is printed as it ends, by one run or the other
        assert re.search(r"^step \d: reward [\d.]+ over \d+ rollouts at temperature 1; seconds: rollouts [\d.]+ "
                         r"\(scoring [\d.]+\), train [\d.]+$", printed, re.M), printed  # fmt: skip
        assert re.search(r"^eval at step 0: \{.*\} \([\d.]+ s\)$", printed, re.M), printed
        assert generator_requests(server) == 1  # nothing regenerated
        assert (out / "scenarios.jsonl").read_text().splitlines() == scenarios

    history = [json.loads(line) for line in (checkpoints.parent / "history.jsonl").read_text().splitlines()]
    assert [row["step"] for row in history] == [1, 2]  # no step trained twice, none skipped
    assert all(row["config"]["max_staleness"] == 1 and "pipeline/staleness" in row["metrics"] for row in history)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 2 and [m["step"] for m in summary["evaluation"]["models"]] == [0, 2]
    assert summary["evaluation"]["comparisons"][0]["judged"] is not None  # RULER: judged side by side too
    assert summary["generation"]["calls"] == 1 and summary["generation"]["prompt_tokens"] == 10
    assert "evaluation heldout: pairs" in second.stdout and "judge (this run):" in second.stdout
    assert "cost unknown" in second.stdout  # the scripted judge is in no price map: not a made-up $0
    trajectories = [
        json.loads(line)
        # "\n" only: the tiny model's random text may hold characters str.splitlines() also splits on (U+2028...)
        for line in (checkpoints.parent / "trajectories" / "train" / "0001.jsonl").read_text().split("\n")
        if line
    ]
    assert trajectories  # the server kept what it trained on


def test_mcp_rl_refuses_a_run_folder_of_another_task(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "task.json").write_text(json.dumps({"kind": "autorl", "task": "summarise emails"}))
    result = subprocess.run(
        [sys.executable, "-m", "art_agents", "mcp-rl", "--server", "mcp-server-time", "--base-model", "x",
         "--judge-model", "openai/judge", "--out", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert "holds a run of a different task" in result.stderr and "--fresh" in result.stderr


def test_mcp_rl_needs_a_server_and_a_scorer(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "art_agents", "mcp-rl", "--base-model", "x", "--out", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "give exactly one MCP server" in result.stderr


def test_a_toml_config_with_flags_over_it(tmp_path: Path) -> None:
    from art_agents.autorl.mcp_rl import MCPRLConfig
    from art_agents.train_config import TrainConfig

    path = tmp_path / "run.toml"
    path.write_text(
        'server = "uvx mcp-server-time"\nbase_model = "Qwen/Qwen3-0.6B"\njudge_model = "openai/gpt-4.1-mini"\n'
        'steps = 5\nout = "runs/a"\npipeline = true\n[rollout]\nmax_turns = 3\n[train]\nlearning_rate = 2e-4\n'
        '[judge_params]\napi_base = "http://127.0.0.1:9/v1"\n'
    )
    flags = {"steps": 7, "rollout": {"max_turns": None, "max_tokens": 99}, "train": {"learning_rate": None}}
    config = MCPRLConfig.load(path, {**flags, "judge_params": {"api_base": None, "api_key": "k"}, "out": None})
    assert config.steps == 7 and config.rollout.max_turns == 3 and config.rollout.max_tokens == 99
    assert config.train.learning_rate == 2e-4 and config.out == tmp_path / "runs" / "a"
    assert config.judge_params == {"api_base": "http://127.0.0.1:9/v1", "api_key": "k"}
    assert config.loop_options()["pipeline"] is True and config.loop_options()["max_steps_off_policy"] == 1
    plain = MCPRLConfig.load(None, {"server": "x", "base_model": "m", "train": {"learning_rate": None}})
    assert plain.train.learning_rate == TrainConfig().learning_rate == 5e-4  # the library default: one to document
    assert plain.out == Path("mcp-rl-run")  # defaults survive empty tables


def teacher_or_scripted(body: dict[str, Any]) -> str | dict[str, Any]:
    """The teacher looks the time up, then completes the task with it; the generator and judge as above."""
    if body["model"] != "teacher":
        return generator_or_judge(body)
    last = body["messages"][-1]
    name, arguments = (
        ("get_current_time", {"timezone": "Asia/Tokyo"})
        if last["role"] == "user"
        else ("complete_task", {"answer": f"It is {json.loads(last['content'])['datetime'][11:16]}."})
    )
    call = {"id": f"call_{len(body['messages'])}", "type": "function", "function": {"name": name}}
    call["function"]["arguments"] = json.dumps(arguments)
    return {"content": None, "tool_calls": [call]}


@pytest.mark.timeout(400)
@pytest.mark.slow  # a warmup and an RL step on the tiny model
def test_an_sft_warmup_runs_before_rl_and_is_not_redone(tiny_model_path: Path, tmp_path: Path) -> None:
    out, config = tmp_path / "run", tmp_path / "run.toml"
    env = {**os.environ, "ART_AGENTS_RULER_CACHE": str(tmp_path / "ruler-cache")}
    config.write_text(  # a worked example in every prompt: the warmup must not train it
        '[rollout]\nexamples = [{role = "user", content = "What time is it in Lima?"}, '
        '{role = "assistant", content = "I would call get_current_time with America/Lima."}]\n'
    )
    with ScriptedOpenAI() as server:
        server.default = teacher_or_scripted
        argv = [
            *command(server.base_url, tiny_model_path, out), "--config", str(config),
            "--steps", "1", "--scenarios", "2", "--val-scenarios", "1", "--groups-per-step", "1",
            "--sft-warmup", "2", "--teacher-model", "teacher", "--teacher-api-base", server.base_url,
        ]  # fmt: skip
        first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert first.returncode == 0, first.stderr
        teacher_calls = sum(r["model"] == "teacher" for r in server.requests)
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        assert sum(r["model"] == "teacher" for r in server.requests) == teacher_calls  # not asked again

    assert teacher_calls == 2 * 2 * 2  # 2 rollouts of each of 2 scenarios, 2 model calls each
    assert re.search(r"teacher rollouts [\d.]+ s, scoring [\d.]+ s", first.stdout)
    assert "SFT warmup: kept" in first.stdout and "reusing the SFT warmup" in second.stdout
    warmup = json.loads((out / "warmup.json").read_text())
    assert warmup["done"] and warmup["sft_step"] == 1 and warmup["rollouts"] == 4 and warmup["failed"] == 0
    assert warmup["kept"] + warmup["dropped"] == 4 and warmup["kept"] >= 2  # the judge's best of each group
    assert set(warmup["seconds"]) == {"teacher_rollouts", "scoring", "sft"}
    assert warmup["sft_metrics"]["turns_retokenized"] == 2 * warmup["kept"]  # its own two turns, not the example
    groups = [json.loads(line) for line in (out / "warmup" / "teacher.jsonl").read_text().split("\n") if line]
    assert [len(g["trajectories"]) for g in groups] == [2, 2]
    assert all(t["messages"][2]["weight"] == 0 for g in groups for t in g["trajectories"])
    assert all(
        t["metrics"]["completed"] and t["metrics"]["tool_errors"] == 0 for g in groups for t in g["trajectories"]
    )
    history = out / "art" / "mcp-rl" / "models" / "mcp-agent" / "history.jsonl"
    rows = [json.loads(line) for line in history.read_text().splitlines()]
    assert [(row["step"], row["kind"]) for row in rows] == [(1, "sft"), (2, "rl")]  # --steps counts RL steps
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 2 and summary["warmup"]["sft_step"] == 1


def completes_best(body: dict[str, Any]) -> str | dict[str, Any]:
    """The teacher as above; the judge scores a rollout that completed its task 0.9 and any other 0.1 (and judges
    two answers side by side as above)."""
    system = body["messages"][0]["content"]
    if body["model"] == "teacher" or "training tasks" in system or system.startswith("You compare two answers"):
        return teacher_or_scripted(body)
    return answer([(i, 0.9 if "complete_task" in text else 0.1) for i, text in shown(body)])


@pytest.mark.timeout(400)
@pytest.mark.slow  # an RL step on the tiny model
def test_rl_with_guidance_trains_the_teachers_rollout_in_a_group_the_student_failed(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "ART_AGENTS_RULER_CACHE": str(tmp_path / "ruler-cache")}
    with ScriptedOpenAI() as server:
        server.default = completes_best
        argv = [
            *command(server.base_url, tiny_model_path, out), "--steps", "1", "--scenarios", "2",
            "--val-scenarios", "1", "--groups-per-step", "1",
            "--guide-below", "0.5", "--teacher-model", "teacher", "--teacher-api-base", server.base_url,
        ]  # fmt: skip
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "(1 groups guided by the teacher)" in done.stdout
    history = out / "art" / "mcp-rl" / "models" / "mcp-agent" / "history.jsonl"
    (row,) = [json.loads(line) for line in history.read_text().splitlines()]
    assert row["step"] == 1 and row["metrics"]["turns_retokenized"] == 2  # the teacher's two calls, as the student's
    assert row["metrics"]["turns_foreign"] == 0


def test_a_teacher_that_is_down_is_named_before_anything_runs(tmp_path: Path) -> None:
    from mcp_fixtures import free_port

    teacher = f"http://127.0.0.1:{free_port()}/v1"
    result = subprocess.run(
        [sys.executable, "-m", "art_agents", "mcp-rl", "--server", "mcp-server-time", "--base-model", "x",
         "--judge-model", "openai/judge", "--judge-api-key", "sk-test", "--out", str(tmp_path / "r"),
         "--sft-warmup", "2", "--teacher-model", "big", "--teacher-api-base", teacher],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    error = result.stderr.strip()
    assert "\n" not in error and "teacher 'big'" in error and teacher in error and "--teacher-api-base" in error
    assert not (tmp_path / "r").exists()  # a run that stops at its checks leaves nothing to block the next one


@pytest.mark.parametrize("needs_teacher", [["--sft-warmup", "2"], ["--guide-below", "1.0"]])
def test_an_sft_warmup_or_guidance_needs_a_teacher(tmp_path: Path, needs_teacher: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "art_agents", "mcp-rl", "--server", "x", "--base-model", "x",
         "--judge-model", "openai/judge", *needs_teacher, "--out", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "needs a teacher" in result.stderr and "--teacher-model" in result.stderr

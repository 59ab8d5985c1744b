"""`art-agents autorl` on bad input: each a clear error naming the fix, and a run folder left consistent."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from autorl_fixtures import TASK, ScriptedAutoRL
from cpu_clock import REFUSED_AT_ONCE_CPU_S, children_cpu_s
from scripted_openai import ScriptedOpenAI


def autorl(*args: str, cwd: Path | None = None, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "art_agents", "autorl", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, **env},
    )  # fmt: skip


PROGRESS_BAR = re.compile(r"^[\w ]+: +\d+%\|")  # tqdm's, on stderr while evaluating


def one_line_with_log(stderr: str, tmp_path: Path) -> tuple[str, str]:
    """The one error line, and the log it points to (under TMPDIR=tmp_path) with the rest."""
    (line,) = [line for line in stderr.splitlines() if line.strip() and not PROGRESS_BAR.match(line)]
    match = re.search(r"\(details: (.+\.log)\)$", line)
    assert match and Path(match[1]).parent == tmp_path / "art-agents", line
    return line, Path(match[1]).read_text()


def llm_flags(role: str, url: str) -> list[str]:
    return [f"--{role}-model", f"openai/{role}", f"--{role}-api-base", url, f"--{role}-api-key", "sk-test"]


def dead_url() -> str:
    with socket.socket() as probe:  # a port nobody listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_bad_settings_are_refused_in_one_line_naming_the_flag_before_anything_is_written(tmp_path: Path) -> None:
    common = ["--base-model", "x", "--judge-model", "openai/j", "--out", str(tmp_path / "r")]
    for task in ("  ", "hi"):
        result = autorl("--task", task, *common)
        assert result.returncode == 2
        assert result.stderr.startswith("error: --task: the task description is empty or too short")
        assert len(result.stderr.splitlines()) == 1 and "--task-file" in result.stderr

    before = children_cpu_s()
    result = autorl("--task", TASK, "--group-size", "1", "--steps", "0", *common)
    assert children_cpu_s() - before < REFUSED_AT_ONCE_CPU_S and result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: --steps: Input should be greater than or equal to 1 (got 0); "
        "--group-size: Input should be greater than or equal to 2 (got 1)"
    ]
    config = tmp_path / "run.toml"
    config.write_text('seed = "x"\n')
    result = autorl("--task", TASK, "--config", str(config), *common)
    assert result.stderr.splitlines() == [
        f"error: seed in {config}: Input should be a valid integer, unable to parse string as an integer (got 'x')"
    ]
    assert not (tmp_path / "r").exists()


def test_a_generator_that_always_answers_garbage_fails_and_a_rerun_starts_clean(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with ScriptedOpenAI() as server:
        server.default = "Sure! Here are some great inputs for you: 1. hello 2. bonjour"
        flags = ["--task", TASK, "--base-model", "x", *llm_flags("judge", server.base_url), "--out", str(out)]
        failed = autorl(*flags, "--dry-run", TMPDIR=str(tmp_path))
        assert failed.returncode == 1, failed.stderr
        line, log = one_line_with_log(failed.stderr, tmp_path)
        assert "gave no usable answer in 3 attempts (last: the answer is not valid JSON" in line
        assert "stronger generator model" in line and "pydantic.dev" not in line
        assert [n for n in range(1, 4) if f"attempt {n}: the answer is not valid JSON" in log] == [1, 2, 3]
        assert sorted(p.name for p in out.iterdir()) == ["generation.json", "task.json"]  # what it cost, nothing else
        assert json.loads((out / "generation.json").read_text())["calls"] == 3

        server.default = ScriptedAutoRL()
        dry = autorl(*flags, "--dry-run", "--inputs", "3", "--eval-inputs", "2")
    assert dry.returncode == 0, dry.stderr
    assert "rubric" in dry.stdout and "Translate:" in dry.stdout and "without --dry-run" in dry.stdout
    assert "Generator cost so far: unknown (LiteLLM has no price for openai/judge)." in dry.stdout
    assert len((out / "inputs.jsonl").read_text().splitlines()) == 3
    assert len((out / "eval.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "generation.json").read_text())["calls"] == 3 + 3  # the failed attempts stay counted


@pytest.mark.slow  # two server starts and judge timeouts: ~45 s, kept out of the default suite's budget
@pytest.mark.timeout(300)
def test_a_judge_that_is_down_or_times_out_stops_the_run_with_the_fix(tiny_model_path: Path, tmp_path: Path) -> None:
    with ScriptedOpenAI() as generator, ScriptedOpenAI(delay_s=2.0) as slow_judge:
        generator.default = slow_judge.default = ScriptedAutoRL()
        common = ["--task", TASK, "--base-model", str(tiny_model_path), *llm_flags("generator", generator.base_url),
                  "--inputs", "2", "--eval-inputs", "2", "--max-tokens", "4"]  # fmt: skip

        down = autorl(
            *common, *llm_flags("judge", dead_url()), "--out", str(tmp_path / "down"), timeout=200, TMPDIR=str(tmp_path)
        )
        assert down.returncode == 1, down.stderr
        line, log = one_line_with_log(down.stderr, tmp_path)
        assert "'openai/judge' could not be reached in 3 attempts" in line
        assert "Check that the judge is running and its api_base" in line and "attempt 3:" in log
        assert "Give Feedback" not in down.stdout and "never awaited" not in down.stderr
        saved = sorted(p.name for p in (tmp_path / "down").iterdir())
        assert {"task.json", "inputs.jsonl", "eval.jsonl", "rubric.md", "system_prompt.md"} <= set(saved)
        assert "eval" not in saved  # no evaluation was recorded from a judge that never answered

        config = tmp_path / "slow.toml"
        config.write_text(f'judge_model = "openai/judge"\n[judge_params]\napi_base = "{slow_judge.base_url}"\n'
                          'api_key = "sk-test"\ntimeout = 0.3\n')  # fmt: skip
        slow = autorl(
            *common, "--config", str(config), "--out", str(tmp_path / "slow"), timeout=200, TMPDIR=str(tmp_path)
        )
        assert slow.returncode == 1, slow.stderr
        line, _ = one_line_with_log(slow.stderr, tmp_path)
        assert "could not be reached" in line and "Timeout" in line and "give it more time" in line


def test_a_generator_that_is_down_fails_in_one_line_without_litellm_banners(tmp_path: Path) -> None:
    flags = ["--task", TASK, "--base-model", "x", *llm_flags("judge", dead_url()), "--out", str(tmp_path / "run")]
    failed = autorl(*flags, "--dry-run", TMPDIR=str(tmp_path))
    assert failed.returncode == 1 and failed.stdout.splitlines() == [
        "writing the system prompt and rubric with openai/judge"
    ]
    line, log = one_line_with_log(failed.stderr, tmp_path)
    assert "'openai/judge' could not be reached in 3 attempts" in line and "Check that the generator is running" in line
    assert "asking again in" in log  # the retries' warnings went to the log, not the terminal
    assert "Give Feedback" not in failed.stdout + failed.stderr + log and "never awaited" not in failed.stderr


def test_a_run_folder_of_another_task_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "task.json").write_text(json.dumps({"kind": "mcp-rl", "server": "mcp-server-time"}))
    result = autorl("--task", TASK, "--base-model", "x", "--judge-model", "openai/j", "--out", str(out), "--dry-run")
    assert result.returncode == 1
    assert "holds a run of a different task" in result.stderr and "--fresh" in result.stderr
    assert json.loads((out / "task.json").read_text())["kind"] == "mcp-rl"  # left as it was

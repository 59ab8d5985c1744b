"""`art-agents quickstart` as a new user runs it: a table whose steps match history.jsonl, the default run
reaching its 20 steps, a rerun that continues to the requested total or says why it cannot, `--fresh`, a
one-line Ctrl-C, and `art-agents report` finding the run."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from art_agents.server.ops.quickstart import Stall, model_folder

QUICKSTART = [sys.executable, "-m", "art_agents", "quickstart"]


def ctrl_c_as_in_a_terminal() -> None:
    """The child gets SIGINT as a terminal's Ctrl-C does: a test worker whose SIGINT is ignored or blocked (seen in a
    full-suite run: the quickstart ran on to the end after the signal) passes that on to what it starts."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*QUICKSTART, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def server_processes(art_path: Path) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "serve" in text and str(art_path) in text:
            found.append(text)
    return found


@pytest.mark.slow
def test_quickstart_resumes_to_the_requested_total_and_reports_where_its_data_went(tmp_path: Path) -> None:
    first = run(tmp_path, "--steps", "2")
    assert first.returncode == 0, first.stderr
    assert "skipped: no reward spread" in first.stdout and "run data" in first.stdout
    model_dir = tmp_path / ".art" / "quickstart" / "models" / "quickstart"
    history = [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()]
    rows = [line.split() for line in first.stdout.splitlines() if line.strip().startswith("step ")]
    saved_as = [row[-1] for row in rows if row[-2] == "step"]
    assert [row["step"] for row in history] == [int(s) for s in saved_as] == [1, 2]

    more = run(tmp_path, "--steps", "3")
    assert "resuming at step 2: 1 steps to go" in more.stdout, more.stdout
    assert [json.loads(line)["step"] for line in (model_dir / "history.jsonl").read_text().splitlines()] == [1, 2, 3]
    done = run(tmp_path, "--steps", "3")
    assert done.returncode == 0 and "already at step 3" in done.stdout

    report = subprocess.run(
        [sys.executable, "-m", "art_agents", "report"], cwd=tmp_path, capture_output=True, text=True
    )
    assert report.returncode == 0 and "quickstart/quickstart" in report.stdout

    again = run(tmp_path, "--steps", "1", "--fresh")
    assert "resuming" not in again.stdout and "quickstart@0" in again.stdout
    assert len((model_dir / "history.jsonl").read_text().splitlines()) == 1


def history_steps(art_path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (model_folder(art_path) / "history.jsonl").read_text().splitlines()]


def test_a_rerun_at_the_step_where_the_last_run_stalled_says_so_and_trains_nothing(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / ".art")
    folder.mkdir(parents=True)
    Stall(step=0, rollouts=8, reward=0.0).save(folder)  # what a run whose first three rounds were flat leaves

    rerun = run(tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.splitlines() == [Stall(0, 8, 0.0).message(20)], rerun.stdout
    assert "no reward spread" in rerun.stdout and "--rollouts 16" in rerun.stdout
    assert not (folder / "history.jsonl").exists() and not (tmp_path / ".art" / "quickstart" / "tiny-model").exists()


@pytest.mark.slow
def test_the_default_run_reaches_its_20_steps_and_a_rerun_after_a_stall_says_so(tmp_path: Path) -> None:
    default = run(tmp_path)
    assert default.returncode == 0, default.stderr
    assert history_steps(tmp_path / ".art") == list(range(1, 21)), default.stdout
    assert "no reward spread (" not in default.stdout and "at step 20" in default.stdout.splitlines()[-2]

    further = run(tmp_path, "--steps", "60")  # the toy task is solved (all "a") long before step 60
    stalled_at = history_steps(tmp_path / ".art")[-1]
    assert 20 < stalled_at < 60 and f"step {stalled_at} of 60: the last 3 rounds had no reward spread" in further.stdout

    rerun = run(tmp_path, "--steps", "60")
    assert rerun.returncode == 0 and len(rerun.stdout.splitlines()) == 1, rerun.stdout
    assert rerun.stdout.startswith(f"step {stalled_at} of 60:") and "mean reward" in rerun.stdout
    assert history_steps(tmp_path / ".art")[-1] == stalled_at


@pytest.mark.slow
def test_ctrl_c_prints_one_line_saying_what_is_saved_and_leaves_no_server(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [*QUICKSTART, "--steps", "50"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip().startswith("step 1 "):  # one update done, the next under way
            break
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    message = lines[0]
    assert (
        message.startswith("interrupted: checkpoint ")
        and "rerun `art-agents quickstart --steps 50` to continue" in message
    )
    assert not server_processes(tmp_path / ".art")


def test_ctrl_c_while_the_tiny_model_builds_ends_the_run_at_once_and_repeats_the_users_flags(tmp_path: Path) -> None:
    import psutil

    art_path = tmp_path / "my runs" / ".art"
    process = subprocess.Popen(
        [*QUICKSTART, "--art-path", str(art_path), "--steps", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )
    builder = None
    for _ in range(600):  # the tiny model is built in a child of its own, which a Ctrl-C ends with the run
        builder = next((c for c in psutil.Process(process.pid).children() if "tiny-model" in c.cmdline()), None)
        if builder is not None or process.poll() is not None:
            break
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    again = f"art-agents quickstart --steps 3 --art-path {shlex.quote(str(art_path))}"  # quoted: a space in it
    assert err.strip().splitlines() == [f"interrupted: nothing was trained yet; `{again}` starts the run"]
    assert builder is not None and not builder.is_running()
    quickstart = art_path / "quickstart"
    assert not quickstart.exists() or list(quickstart.iterdir()) == []  # no half-built model, no temp folder

"""`art-agents quickstart` as a new user runs it: a table whose steps match history.jsonl, a rerun that
continues to the requested total, `--fresh`, a one-line Ctrl-C, and `art-agents report` finding the run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

QUICKSTART = [sys.executable, "-m", "art_agents", "quickstart"]


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


@pytest.mark.slow
def test_ctrl_c_prints_one_line_saying_what_is_saved_and_leaves_no_server(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [*QUICKSTART, "--steps", "50"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip().startswith("step 1 "):  # one update done, the next under way
            break
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130
    (message,) = err.strip().splitlines()
    assert message.startswith("interrupted: checkpoint ") and "rerun `art-agents quickstart` to continue" in message
    assert not server_processes(tmp_path / ".art")

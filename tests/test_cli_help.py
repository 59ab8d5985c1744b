"""`art-agents --help` as a user reads it: no type on flags, arguments named alike, required options and the judge's
key said, and a report table whose column names are whole at 80 columns."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["autorl", "doctor", "mcp-rl", "quickstart", "report", "serve", "tiny-model", "train", "trainer-node"]


def cli(*args: str, columns: int = 100, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "art_agents", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, env={**os.environ, "COLUMNS": str(columns)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=["art-agents", *COMMANDS])
def test_help_gives_flags_no_type_and_names_arguments_in_capitals(command: list[str]) -> None:
    text = cli(*command, "--help")
    assert "<bool>" not in text  # a flag takes no value
    assert re.search(r"--help\s+Show this message", text)
    (usage,) = [line for line in text.splitlines() if "Usage:" in line]
    for argument in re.findall(r"[\[{]([^\]}]+)[\]}]", usage):
        assert argument.rstrip(".") == argument.rstrip(".").upper(), usage  # PATH, JOB_FILE, RUN_DIR alike


def test_autorl_and_mcp_rl_say_what_is_required_and_that_the_judge_needs_a_key() -> None:
    for command, required in (("autorl", ("--base-model", "--judge-model")), ("mcp-rl", ("--base-model",))):
        text = " ".join(cli(command, "--help", columns=400).split())
        for flag in required:
            assert re.search(rf"{flag} <str> [^│]*Required \(here or in --config\)", text), flag
        assert "OPENAI_API_KEY" in text and "--judge-api-base of your own needs none" in text
    assert "This or --url is required" in " ".join(cli("mcp-rl", "--help", columns=400).split())


def test_the_readme_names_every_command_of_the_design() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for command in ("serve", "autorl", "mcp-rl", "train", "report"):
        assert f"art-agents {command}" in readme


def test_report_shows_whole_column_names_at_80_columns(tmp_path: Path) -> None:
    model_dir = tmp_path / "proj" / "models" / "agent"
    model_dir.mkdir(parents=True)
    (model_dir / "model.json").write_text("{}")
    metrics = {"reward_mean": 0.25, "reward_std": 0.5, "loss": 0.125, "groups_skipped_zero_variance": 1,
               "turns_retokenized": 2, "train_s": 1.5}  # fmt: skip
    (model_dir / "history.jsonl").write_text(json.dumps({"step": 1, "metrics": metrics}) + "\n")
    text = cli("report", "--art-path", str(tmp_path), columns=80)
    table = text[: text.index("report: ")]
    assert "…" not in table and max(len(line) for line in table.splitlines()) <= 80 and "┓" in table
    header = table[: table.index("┡")]
    for name in metrics:
        assert all(f"{word}_" in header for word in name.split("_")[:-1]) and name.split("_")[-1] in header, name

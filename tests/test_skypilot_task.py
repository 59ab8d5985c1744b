"""examples/skypilot/serve.yaml: what it runs is a valid `art-agents serve` command with the key kept out of the
file, and SkyPilot's own parser (in a virtualenv of its own: its pins clash with ours) accepts it."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "skypilot" / "serve.yaml"
SKYPILOT = "skypilot==0.14.1"


def serve_flags(run: str) -> list[str]:
    command = shlex.split(run.replace("\\\n", " "))
    return [word for word in command[command.index("serve") + 1 :] if word.startswith("--")]


def test_the_task_runs_a_valid_serve_command_and_keeps_the_key_out_of_the_file() -> None:
    task = yaml.safe_load(TASK.read_text())
    assert task["secrets"] == {"ART_AGENTS_API_KEY": None}  # given at launch with --secret, never in the file
    assert "ART_AGENTS_API_KEY" not in task.get("envs", {})
    help_text = subprocess.run(
        [sys.executable, "-m", "art_agents", "serve", "--help"], capture_output=True, text=True, env={"COLUMNS": "200"}
    ).stdout
    assert "ART_AGENTS_API_KEY" in help_text  # serve reads the key from the secret's environment variable
    flags = serve_flags(task["run"])
    assert flags and all(flag in help_text for flag in flags), flags
    port = shlex.split(task["run"].replace("\\\n", " "))
    assert port[port.index("--port") + 1] == str(task["resources"]["ports"])
    assert port[port.index("--host") + 1] == "0.0.0.0"


@pytest.mark.slow  # installs SkyPilot into a fresh virtualenv (about 30 s)
def test_skypilots_parser_accepts_the_task(tmp_path: Path) -> None:
    env_dir = tmp_path / "sky-env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    install = subprocess.run([python, "-m", "pip", "install", "-q", SKYPILOT], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]
    check = (
        "import json, sys, yaml, sky\n"
        "config = yaml.safe_load(open(sys.argv[1]))\n"
        "task = sky.Task.from_yaml_config(config, secrets_overrides=[('ART_AGENTS_API_KEY', 'k')])\n"
        "print(json.dumps({'accelerators': sorted(str(r.accelerators) for r in task.resources),\n"
        "    'ports': sorted({p for r in task.resources for p in r.ports}), 'secrets': sorted(task.secrets),\n"
        "    'workdir': str(task.workdir)}))\n"
    )
    done = subprocess.run(
        [python, "-c", check, str(TASK)], capture_output=True, text=True, env={"HOME": str(tmp_path)}, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed["ports"] == ["8000"] and parsed["secrets"] == ["ART_AGENTS_API_KEY"]
    assert any(re.search(r"H100", a) for a in parsed["accelerators"]), parsed

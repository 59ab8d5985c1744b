"""The several-node recipes: examples/skypilot/nodes.yaml runs examples/multi-node/node.sh on 2 nodes with
SkyPilot's node rank and node 0's address, node 0's command is a valid `art-agents serve` (node 1's, the
trainer-node, is what tests/test_trainer_nodes.py starts its nodes with), and examples/multi-node/router.sh gives
vLLM's router (installed from PyPI into a virtualenv of its own) only flags it knows."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TASK = ROOT / "examples" / "skypilot" / "nodes.yaml"
NODE_SCRIPT = ROOT / "examples" / "multi-node" / "node.sh"
ROUTER = "vllm-router==0.1.17"


def test_the_task_runs_the_node_script_on_two_nodes_with_skypilots_rank_and_node_0s_address() -> None:
    task = yaml.safe_load(TASK.read_text())
    assert task["num_nodes"] == 2
    assert task["secrets"] == {"ART_AGENTS_API_KEY": None}
    run = task["run"]
    assert 'NODE_RANK="$SKYPILOT_NODE_RANK"' in run and '"$SKYPILOT_NODE_IPS" | head -n1' in run
    assert "bash examples/multi-node/node.sh" in run
    assert str(task["resources"]["ports"]) == "8000"


def test_node_0_serves_with_the_rendezvous_in_its_environment(tmp_path: Path) -> None:
    """node.sh with an ART_ENV whose art-agents prints what it was started with: the flags must be serve's."""
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    show = bin_dir / "art-agents"
    show.write_text(
        f'#!/bin/sh\necho "$ART_TRAINER_RENDEZVOUS"\necho "$@"\nexec {sys.executable} -m art_agents "$@" --help\n'
    )
    show.chmod(0o755)
    env = {
        "NODE_RANK": "0",
        "NODE0_ADDR": "10.0.0.1",
        "ART_PATH": str(tmp_path / "art"),
        "ART_ENV": str(tmp_path / "env"),
    }
    done = subprocess.run(
        ["bash", str(NODE_SCRIPT)],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "COLUMNS": "200"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rendezvous, command, *help_text = done.stdout.splitlines()
    assert rendezvous == "10.0.0.1:29400"
    words = shlex.split(command)
    assert words[0] == "serve" and words[words.index("--host") + 1] == "0.0.0.0"
    flags = [word for word in words if word.startswith("--")]
    assert all(flag in "\n".join(help_text) for flag in flags), flags


@pytest.mark.slow  # installs vllm-router (a 24 MB wheel) into a fresh virtualenv
def test_the_router_recipe_starts_vllms_router_with_flags_it_knows(tmp_path: Path) -> None:
    env_dir = tmp_path / "router-env"
    venv.create(env_dir, with_pip=True)
    install = subprocess.run(
        [env_dir / "bin" / "python", "-m", "pip", "install", "-q", ROUTER], capture_output=True, text=True
    )
    assert install.returncode == 0, install.stderr[-3000:]
    help_text = subprocess.run([env_dir / "bin" / "vllm-router", "--help"], capture_output=True, text=True).stdout
    recipe = (ROOT / "examples" / "multi-node" / "router.sh").read_text()
    command = shlex.split(recipe[recipe.index('exec "${ROUTER') :].replace("\\\n", " "))
    flags = [word for word in command if word.startswith("--")]
    assert flags and all(flag in help_text for flag in flags), flags
    assert "consistent_hash" in help_text

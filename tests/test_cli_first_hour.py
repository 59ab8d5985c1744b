"""What a new user meets first on the command line: help on every option, one-line errors naming the fix,
and `art-agents report` finding the last run without flags."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from cpu_clock import REFUSED_AT_ONCE_CPU_S, children_cpu_s

from art_agents.cli.main import app, load_parts


def run_cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "art_agents", *args], capture_output=True, text=True, cwd=cwd, env={**os.environ, **env}
    )


def test_every_option_of_every_command_has_help_text() -> None:
    load_parts()
    group = typer.main.get_command(app)
    undocumented = [
        f"{name} {param.opts[0]}"
        for name, command in group.commands.items()  # type: ignore[attr-defined]
        for param in command.params
        if not getattr(param, "help", None) and param.opts[0] != "--help"
    ]
    assert len(group.commands) >= 7 and not undocumented


def test_a_command_whose_extra_is_missing_names_the_extra_in_one_line() -> None:
    code = "import sys; sys.modules['uvicorn'] = None; sys.argv = ['art-agents', 'serve']; from art_agents.cli.main import run; run()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: art-agents serve needs the 'server' extra (No module named 'uvicorn'): "
        "pip install 'art-agents[server]' (from a clone: pip install -c constraints.txt -e '.[server]')"
    ]


def test_doctor_on_a_cpu_only_torch_says_so() -> None:
    import torch

    result = run_cli("doctor")
    assert result.returncode == 0, result.stderr
    if torch.version.cuda is None:  # the CPU wheel the tests install
        assert "a CPU-only build" in result.stdout and "CUDA None" not in result.stdout


def test_serve_names_a_missing_base_model_folder_or_an_offline_hub_in_seconds(tmp_path: Path) -> None:
    alone = run_cli("serve", "--art-path", str(tmp_path), "--model", "m")
    assert alone.returncode == 2 and "--model and --base-model go together" in alone.stderr

    missing = run_cli("serve", "--art-path", str(tmp_path), "--model", "m", "--base-model", "./no/such/model")
    assert missing.returncode == 2 and "'./no/such/model': no such folder" in missing.stderr

    before = children_cpu_s()
    offline = run_cli(
        "serve", "--art-path", str(tmp_path), "--model", "m", "--base-model", "SomeOrg/not-cached", HF_HUB_OFFLINE="1"
    )
    assert offline.returncode == 2 and "HF_HUB_OFFLINE=1" in offline.stderr and "local folder" in offline.stderr
    assert children_cpu_s() - before < REFUSED_AT_ONCE_CPU_S  # said before loading transformers and its hub retries
    assert not (tmp_path / "default").exists()  # nothing was created for a model that cannot load


def _trained_model(art_path: Path, project: str, name: str, reward: float) -> Path:
    model_dir = art_path / project / "models" / name
    model_dir.mkdir(parents=True)
    (model_dir / "model.json").write_text("{}")
    (model_dir / "history.jsonl").write_text(json.dumps({"step": 1, "metrics": {"reward_mean": reward}}) + "\n")
    return model_dir


def test_report_without_flags_shows_the_most_recent_run_and_names_the_others(tmp_path: Path) -> None:
    older = _trained_model(tmp_path / "autorl-run" / "art", "autorl", "writer", 0.25)
    os.utime(older / "history.jsonl", (time.time() - 60, time.time() - 60))
    _trained_model(tmp_path / ".art", "quickstart", "quickstart", 0.75)

    result = run_cli("report", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "quickstart/quickstart" in result.stdout and "0.75" in result.stdout
    assert "autorl/writer" not in result.stdout and "also here:" in result.stdout and "--model writer" in result.stdout

    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = run_cli("report", cwd=empty)
    assert nothing.returncode == 1 and "no trained models in this folder" in nothing.stdout


def test_report_open_without_a_browser_names_the_page_and_says_none_was_found(tmp_path: Path) -> None:
    model_dir = _trained_model(tmp_path / ".art", "quickstart", "quickstart", 0.75)
    no_browsers = tmp_path / "bin"
    no_browsers.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")}
    result = subprocess.run(
        [sys.executable, "-m", "art_agents", "report", str(tmp_path / ".art" / "quickstart"), "--open"],
        capture_output=True,
        text=True,
        env={**env, "PATH": str(no_browsers)},  # no www-browser, lynx, xdg-open, ...: webbrowser finds none
        umask=0o027,
    )
    assert result.returncode == 0, result.stderr
    page = (model_dir / "report.html").resolve()
    assert page.exists() and result.stdout.splitlines()[-1] == (
        f"--open: no web browser was found here; open {page} in one (or copy it to a machine with one), or set "
        "BROWSER to a browser's command"
    )
    assert stat.S_IMODE(page.stat().st_mode) == 0o640  # the umask's mode, though written through a 0o600 temp file


def test_start_up_models_are_checked_before_the_server_loads_anything(tiny_model_path: Path) -> None:
    from art_agents.server.ops.cli import _start_up_models

    assert _start_up_models(None, None, "default") == []
    (request,) = _start_up_models("agent", str(tiny_model_path), "demo")
    assert (request.name, request.project, request.base_model) == ("agent", "demo", str(tiny_model_path))
    with pytest.raises(ValueError, match="--model"):
        _start_up_models("../escape", str(tiny_model_path), "demo")


def test_a_server_started_with_a_model_serves_it_and_says_how_to_register_another(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    import httpx
    from server_fixtures import start_server

    from art_agents.wire import RegisterRequest

    served = RegisterRequest(name="agent", base_model=str(tiny_model_path))
    with start_server(tmp_path / "art", serve_models=[served]) as url:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        reply = httpx.post(f"{url}/v1/chat/completions", json={"model": "agent", **body}, timeout=60)
        assert reply.status_code == 200 and reply.json()["model"] == "agent@0"
        unknown = httpx.post(f"{url}/v1/chat/completions", json={"model": "other", **body}, timeout=60)
        assert unknown.status_code == 404
        assert "art-agents serve --model other --base-model" in unknown.json()["detail"]
        assert "TrainableModel(name='other'" in unknown.json()["detail"]

"""A missing extra is named in one line, before anything starts: by each command and each public entry point.

A package is made missing by a PYTHONPATH entry whose `<name>/__init__.py` raises the error Python raises
for an absent module, or by `sys.modules[name] = None` in process; the slow test builds a real venv
with the README's `.[server]` install and no `mcp`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from cpu_clock import REFUSED_AT_ONCE_CPU_S, run_counting_cpu
from mcp_fixtures import KV_COMMAND, REPO, kv_server

from art_agents.errors import MissingExtra
from art_agents.trajectory import Trajectory, TrajectoryGroup

SERVER_COMMAND = " ".join(KV_COMMAND)


def without(tmp_path: Path, *packages: str) -> dict[str, str]:
    """An environment in which `import <package>` fails as it does when the package is not installed."""
    for name in packages:
        (tmp_path / "missing" / name).mkdir(parents=True)
        (tmp_path / "missing" / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n"
        )
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "missing"), os.environ.get("PYTHONPATH", "")])}


def mcp_rl_line(
    python: str, out: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    return run_counting_cpu(
        [python, "-m", "art_agents", "mcp-rl", "--server", SERVER_COMMAND, "--base-model", "x",
         "--judge-model", "openai/judge", "--out", str(out)],
        env=env, timeout=60,
    )  # fmt: skip


def test_mcp_rl_without_the_mcp_extra_says_so_in_one_line_at_once(tmp_path: Path) -> None:
    result, cpu_s = mcp_rl_line(sys.executable, tmp_path / "run", without(tmp_path, "mcp"))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: art-agents mcp-rl needs the 'mcp' extra (No module named 'mcp'): pip install 'art-agents[mcp]' "
        "(from a clone: pip install -c constraints.txt -e '.[mcp]')"
    ]
    assert cpu_s < REFUSED_AT_ONCE_CPU_S and not (tmp_path / "run").exists()


def test_autorl_without_litellm_names_the_ruler_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['litellm'] = None; from art_agents.cli.main import run; "
        "sys.argv = ['art-agents', 'autorl', '--task', 'Translate short English phrases into French.', "
        f"'--base-model', 'x', '--judge-model', 'openai/j', '--out', {str(tmp_path / 'run')!r}]; run()"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: art-agents autorl needs the 'ruler' extra (No module named 'litellm'): pip install "
        "'art-agents[ruler]' (from a clone: pip install -c constraints.txt -e '.[ruler]')"
    ]
    assert not (tmp_path / "run").exists()


async def test_an_mcp_session_without_the_extra_fails_at_once_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)
    # an hour to connect: a check that waited for the server instead would run into the test's timeout
    with pytest.raises(MissingExtra, match=r"MCPServer.session\(\) needs the 'mcp' extra"):
        async with asyncio.timeout(60), kv_server(connect_timeout_s=3600).session():
            pass


async def test_ruler_without_litellm_raises_even_when_told_to_swallow_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from art_agents.ruler import ruler_score_group

    monkeypatch.setitem(sys.modules, "litellm", None)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    group = TrajectoryGroup([Trajectory(messages_and_choices=messages, reward=0.0) for _ in range(2)])
    with pytest.raises(MissingExtra, match="ruler_score_group needs the 'ruler' extra"):
        await ruler_score_group(group, "openai/judge", swallow_exceptions=True)  # not a silently dropped group


def test_the_langgraph_wrapper_without_langchain_names_the_extra(tmp_path: Path) -> None:
    env = without(tmp_path, "langchain_core")
    for module in ("art_agents.integrations.langgraph", "art_agents.langgraph"):
        result = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, env=env)
        assert result.returncode == 1
        assert result.stderr.splitlines()[-1].startswith(
            f"art_agents.errors.MissingExtra: {module} needs the 'langgraph' extra (No module named 'langchain_core')"
        )


@pytest.mark.slow  # builds a venv and installs `.[server]` from pip's cache: a minute or two
@pytest.mark.timeout(900)
def test_the_readme_install_without_mcp_names_the_extra_for_mcp_rl(tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", "-c", "constraints.txt", "-e", ".[server]"]
    subprocess.run(install, cwd=REPO, check=True, capture_output=True, timeout=840)
    assert subprocess.run([python, "-c", "import mcp"], capture_output=True).returncode == 1  # really not there

    result, cpu_s = mcp_rl_line(python, tmp_path / "run")
    assert result.returncode == 1 and cpu_s < REFUSED_AT_ONCE_CPU_S
    assert result.stderr.splitlines() == [
        "error: art-agents mcp-rl needs the 'mcp' extra (No module named 'mcp'): pip install 'art-agents[mcp]' "
        "(from a clone: pip install -c constraints.txt -e '.[mcp]')"
    ]

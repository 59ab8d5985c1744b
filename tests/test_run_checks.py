"""An MCP•RL run that stops at its checks (a server command that is not installed) writes nothing: the corrected
rerun is not refused as "a run of a different task", and `--fresh` deletes nothing until the checks pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scripted_openai import ScriptedOpenAI


def mcp_rl(server: str, out: Path, judge: ScriptedOpenAI, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "art_agents", "mcp-rl", "--server", server, "--base-model", "x",
         "--judge-model", "openai/judge", "--judge-api-base", judge.base_url, "--out", str(out), *extra],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_server_command_that_is_not_installed_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "time-run"
    with ScriptedOpenAI() as judge:
        first = mcp_rl("uvx-not-installed mcp-server-time", out, judge)
        assert first.returncode == 1
        assert "command 'uvx-not-installed' not found" in first.stderr
        assert not out.exists()

        corrected = mcp_rl("also-not-installed", out, judge)  # another server: refused only for its own reason
        assert corrected.returncode == 1 and "command 'also-not-installed' not found" in corrected.stderr

        out.mkdir()  # an earlier run of another server, which --fresh would replace once the checks pass
        (out / "task.json").write_text(json.dumps({"kind": "mcp-rl", "server": "mcp-server-time"}))
        fresh = mcp_rl("also-not-installed", out, judge, "--fresh")
        assert fresh.returncode == 1 and "not found" in fresh.stderr
        assert judge.requests == []  # nothing was generated or judged
    assert json.loads((out / "task.json").read_text())["server"] == "mcp-server-time"  # kept as it was

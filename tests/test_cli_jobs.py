"""`art-agents train` validates its job file; `art-agents report` reads history."""

from __future__ import annotations

import json
import subprocess
import sys


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "art_agents", *args], capture_output=True, text=True, cwd=cwd)


def test_train_names_the_bad_field_of_a_job_file(tmp_path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "m"\nbase_model = "x"\nrollout = "mod:fn"\nscenarios = "s.jsonl"\nsteps = 0\n')
    result = run_cli("train", str(job))
    assert result.returncode == 2
    assert "steps" in result.stderr and "greater than or equal to 1" in result.stderr


def test_report_prints_each_step(tmp_path) -> None:
    model_dir = tmp_path / "proj" / "models" / "agent"
    model_dir.mkdir(parents=True)
    (model_dir / "model.json").write_text("{}")
    rows = [{"step": s, "metrics": {"reward_mean": 0.1 * s, "loss": 0.5}} for s in (1, 2)]
    (model_dir / "history.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{torn")
    result = run_cli("report", "--art-path", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "proj/agent" in result.stdout and "0.2" in result.stdout
    assert run_cli("report", "--art-path", str(tmp_path / "none")).returncode == 1

"""`art-agents train` validates and runs a job file; `art-agents report` reads history."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
from server_fixtures import ROLLOUT_MODULE

from art_agents import ArtError, TrainConfig, TrainResult, Trajectory, TrajectoryGroup
from art_agents.loop.train import MAX_IDLE_DRAWS, train_loop


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "art_agents", *args], capture_output=True, text=True, cwd=cwd)


def test_train_names_the_bad_field_of_a_job_file(tmp_path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "m"\nbase_model = "x"\nrollout = "mod:fn"\nscenarios = "s.jsonl"\nsteps = 0\n')
    result = run_cli("train", str(job))
    assert result.returncode == 2
    assert "steps" in result.stderr and "greater than or equal to 1" in result.stderr


def test_train_names_a_missing_rollout_module_before_starting_a_server(tmp_path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "m"\nbase_model = "x"\nrollout = "no_such_agent:fn"\nscenarios = "s.jsonl"\n')
    (tmp_path / "s.jsonl").write_text('{"q": 1}\n')
    result = run_cli("train", str(job))
    assert result.returncode == 2
    assert "cannot import 'no_such_agent'" in result.stderr and "beside the job file" in result.stderr
    assert not (tmp_path / ".art").exists()


def test_eval_names_a_missing_scenarios_key_and_a_wrong_art_path_in_one_line_each(tmp_path) -> None:
    (tmp_path / "toy_agent.py").write_text(ROLLOUT_MODULE)
    (tmp_path / "heldout.jsonl").write_text('{"prompt": "Say aaaa!", "letter": "a"}\n')
    job = tmp_path / "job.toml"
    job.write_text('name = "toy"\nbase_model = "x"\nrollout = "toy_agent:attempt"\n')
    result = run_cli("eval", str(job), "--scenarios", str(tmp_path / "heldout.jsonl"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: scenarios in {job} is missing; add it (The training scenarios: a JSONL")
    assert "pydantic" not in result.stderr and "input_value" not in result.stderr

    job.write_text(job.read_text() + 'scenarios = "train.jsonl"\nart_path = "elsewhere"\n')
    result = run_cli("eval", str(job), "--scenarios", str(tmp_path / "heldout.jsonl"), cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"error: art_path in {job}: {tmp_path / 'elsewhere'} holds no model default/toy")
    assert "set art_path, relative to the job file" in result.stderr
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / ".art").exists()  # nothing was created


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


def test_train_runs_a_job_file_end_to_end(tiny_model_path, tmp_path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "toy_agent.py").write_text(ROLLOUT_MODULE)
    scenarios = [{"prompt": "Say aaaa!", "letter": "a"}, {"prompt": "Write b.", "letter": "b"}]
    (job_dir / "scenarios.jsonl").write_text("\n".join(json.dumps(s) for s in scenarios) + "\n")
    (job_dir / "job.toml").write_text(
        f'name = "toy"\nproject = "cli"\nbase_model = "{tiny_model_path}"\nrollout = "toy_agent:attempt"\n'
        'scenarios = "scenarios.jsonl"\nart_path = "art"\nsteps = 2\ngroups_per_step = 2\nrollouts_per_group = 4\n'
        "[model]\nlora_rank = 4\nmax_batch_size = 8\n[train]\nlearning_rate = 1e-3\nmicro_batch_size = 8\n"
    )
    # run from elsewhere: the rollout module, scenarios and art path are found beside the job file
    result = run_cli("train", str(job_dir / "job.toml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # a draw where every group's rewards are equal trains nothing and is drawn again
    steps = [line for line in result.stdout.splitlines() if line.startswith("step ") and "no update" not in line]
    assert [line.split(":")[0] for line in steps] == ["step 1", "step 2"], result.stdout
    assert all("over 8 rollouts" in line for line in steps)
    history = (job_dir / "art" / "cli" / "models" / "toy" / "history.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in history] == [1, 2]
    assert json.loads(history[0])["config"]["learning_rate"] == 1e-3


class ServerThatSkipsFlatGroups:
    """Just what `train_loop` uses of a model: the step advances only when some group's rewards differ."""

    def __init__(self) -> None:
        self.step, self.calls = 0, 0

    async def get_step(self) -> int:
        return self.step

    async def train(self, groups: list[TrajectoryGroup], config: TrainConfig | None = None) -> TrainResult:
        self.calls += 1
        self.step += any(len(set(g.rewards())) > 1 for g in groups)
        return TrainResult(step=self.step, config=config or TrainConfig())


async def test_train_loop_draws_again_when_a_draw_trains_nothing() -> None:
    async def attempt(model: ServerThatSkipsFlatGroups, scenario: dict) -> Trajectory:
        reward = next(scenario["rewards"])
        return Trajectory(
            messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], reward=reward
        )

    flat_then_spread = {"rewards": itertools.chain([0.0] * 4, itertools.cycle([0.0, 1.0]))}
    model = ServerThatSkipsFlatGroups()
    records = await train_loop(model, attempt, [flat_then_spread], steps=2, groups_per_step=2, rollouts_per_group=2)
    assert [(r.step, r.advanced) for r in records] == [(0, False), (1, True), (2, True)]
    assert model.calls == 3

    always_flat = {"rewards": itertools.repeat(0.5)}
    with pytest.raises(ArtError, match=f"{MAX_IDLE_DRAWS} draws in a row trained nothing"):
        await train_loop(model, attempt, [always_flat], steps=1, groups_per_step=1, rollouts_per_group=2)

"""MCP•RL's rollout temperature: lowered after draws that fail alike, raised back after draws that succeed alike,
kept while draws train; in a real run (tiny model, `mcp-server-time` over stdio) the draws after tied ones are
sampled at the lowered temperature until one trains; and `benchmarks/rollout_temperature.py`, which counts valid
tool calls at each temperature the rule steps through, runs."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from benchmark_scripts import BENCHMARKS, load_benchmark

from art_agents.autorl.mcp_rl import MCPRLConfig, run_mcp_rl
from art_agents.autorl.scenarios import Scenario
from art_agents.autorl.temperature import AdaptiveTemperature, TemperatureSchedule


def test_tied_draws_move_the_temperature_and_a_draw_that_trains_keeps_it() -> None:
    temperature = AdaptiveTemperature(1.0, TemperatureSchedule())
    failed_alike = [temperature.after_draw(trained=False, reward_mean=0.05) for _ in range(5)]
    assert failed_alike == [0.7, 0.49, 0.343, 0.3, 0.3]  # down by 0.7 a draw, to the floor
    assert temperature.after_draw(trained=True, reward_mean=0.05) == 0.3  # a spread somewhere: it works, keep it
    succeeded_alike = [temperature.after_draw(trained=False, reward_mean=0.9) for _ in range(5)]
    assert succeeded_alike == [0.429, 0.613, 0.876, 1.0, 1.0]  # back up, never above the start
    fixed = AdaptiveTemperature(1.0, TemperatureSchedule(adapt=False))
    assert {fixed.after_draw(trained=False, reward_mean=0.0) for _ in range(3)} == {1.0}
    low_start = AdaptiveTemperature(0.2, TemperatureSchedule())  # chosen below the floor: never lowered further
    assert low_start.after_draw(trained=False, reward_mean=0.0) == 0.2


def test_flags_set_the_start_and_turn_adapting_off() -> None:
    flags = {
        "server": "x",
        "base_model": "m",
        "rollout": {"temperature": 0.8},
        "temperature_schedule": {"adapt": False},
    }
    config = MCPRLConfig.load(None, flags)
    assert config.rollout.temperature == 0.8 and config.temperature_schedule.adapt is False
    assert MCPRLConfig.load(None, {"server": "x", "base_model": "m"}).temperature_schedule.adapt is True


@pytest.mark.timeout(300)
async def test_draws_after_tied_ones_are_sampled_cooler_until_one_trains(tiny_model_path: Path, tmp_path: Path) -> None:
    """The reward stands in for a small model that fails every attempt alike above temperature 0.5 and tells
    attempts apart below it (as SmolLM2-135M did on mcp-server-time: 0 of 16 valid calls at 1.0, 8 at 0.5)."""
    alternate = itertools.cycle([0.0, 1.0])

    def reward(scenario: Scenario, trajectory: Any) -> float:
        return next(alternate) if trajectory.metrics["temperature"] <= 0.5 else 0.0

    config = MCPRLConfig(
        server=f"{sys.executable} -m mcp_server_time",
        shared_session=True,
        base_model=str(tiny_model_path),
        steps=1,
        val_scenarios=1,
        groups_per_step=1,
        group_size=2,
        rollout={"max_turns": 1, "max_tokens": 4},
        out=tmp_path / "run",
    )
    printed: list[str] = []
    summary = await run_mcp_rl(
        config, reward=reward, scenarios=["Time in Tokyo?", "Time in Lima?", "Time in Oslo?"], echo=printed.append
    )
    steps = [line for line in printed if line.startswith("step ")]
    assert [re.search(r"at temperature ([\d.]+)", line)[1] for line in steps] == ["1", "0.7", "0.49"], printed  # type: ignore[index]
    assert "nothing trained" in steps[0] and "next draw at 0.7" in steps[0] and "next draw" not in steps[2]
    assert [r.metrics["rollout/temperature"] for r in summary.steps] == [1.0, 0.7, 0.49]
    assert [r.advanced for r in summary.steps] == [False, False, True] and summary.step == 1


def test_the_benchmark_draws_at_each_temperature_the_rule_steps_through() -> None:
    script = load_benchmark("rollout_temperature")
    assert script.temperatures(1.0, TemperatureSchedule()) == [1.0, 0.7, 0.49, 0.343, 0.3]


@pytest.mark.slow  # loads the tiny model and starts the server: ~40 s on 2 cores
def test_the_benchmark_runs_on_the_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    command = [sys.executable, str(BENCHMARKS / "rollout_temperature.py"), "--tiny", "--tasks", "1", "--group-size",
               "2", "--max-tokens", "4", "--result", str(out)]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=240, env={**os.environ, "TMPDIR": str(tmp_path)}
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [row["temperature"] for row in rows] == [1.0, 0.7, 0.49, 0.343, 0.3]
    assert all(row["rollouts"] == 2 and row["groups"] == 1 and 0 <= row["valid"] <= 2 for row in rows)
    assert "temperature 0.49: " in done.stdout

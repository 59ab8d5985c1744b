"""benchmarks/learning.py: the strict reward cannot be gamed, and the script runs end to end on the tiny model."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from benchmark_scripts import load_benchmark

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "learning.py"


@pytest.fixture(scope="module")
def learning() -> ModuleType:
    return load_benchmark("learning")


@pytest.mark.parametrize(
    ("kind", "question", "answer", "reply", "reward", "format_ok", "correct"),
    [
        ("colour", "What color is a ripe banana?", "yellow", "A ripe banana is [yellow].", 1.0, True, True),
        ("colour", "What color is a ripe banana?", "yellow", "It is yellow.", 0.5, False, True),
        ("colour", "What color is a ripe banana?", "yellow", "It is [green].", 0.0, True, False),
        ("colour", "What color is a ripe banana?", "yellow", "yellow, green, orange", 0.0, False, False),
        ("colour", "What color is a ripe banana?", "yellow", "[yellow] or [green]", 0.0, False, False),
        ("colour", "What color is a ripe banana?", "yellow", "It is [yellow], or maybe green.", 0.0, True, False),
        ("colour", "What color is a ripe banana?", "yellow", "The answer is [banana].", 0.0, True, False),
        ("colour", "What color is a ripe banana?", "yellow", "[The answer is yellow]", 0.5, True, True),
        ("capital", "What is the capital of Ukraine?", "Kyiv", "The capital of Ukraine is [Kiev].", 1.0, True, True),
        ("capital", "What is the capital of Jordan?", "Amman", "The capital of Jordan is [Jordan].", 0.0, True, False),
        ("opposite", "What is the opposite of hot?", "cold", "The opposite of hot is [cold].", 1.0, True, True),
    ],
)
def test_strict_compound_reward(
    learning: ModuleType,
    kind: str,
    question: str,
    answer: str,
    reply: str,
    reward: float,
    format_ok: bool,
    correct: bool,
) -> None:
    item = learning.Item(kind, question, answer)
    result = learning.score(item, reply, partial_credit=0.5)
    assert (result.reward, result.format_ok, result.correct) == (reward, format_ok, correct)
    assert learning.score(item, reply).reward == (1.0 if reward == 1.0 else 0.0)  # default: no partial credit


def test_split_is_fixed_stratified_and_disjoint(learning: ModuleType) -> None:
    items = learning.build_items()
    train, heldout = learning.split(items)
    assert learning.split(items) == (train, heldout)
    assert not {i.question for i in train} & {i.question for i in heldout}
    assert {i.kind for i in heldout} == {i.kind for i in train} == {"capital", "colour", "opposite", "plural"}
    assert len(train) + len(heldout) == len(items) >= 200


def test_paired_ci_brackets_the_mean_difference(learning: ModuleType) -> None:
    before, after = [0.0] * 50 + [50.0] * 50, [100.0] * 60 + [0.0] * 40
    mean, low, high = learning.paired_ci(before, after)
    assert low < mean < high
    assert mean == pytest.approx(35.0)


def test_paired_ci_is_the_percentile_bootstrap(learning: ModuleType) -> None:
    # 50 zeros and 50 ones: a resample's mean is Binomial(100, 1/2) / 100, whose 2.5% and 97.5% quantiles are known
    before, after = [0.0] * 100, [0.0] * 50 + [1.0] * 50
    cdf = list(itertools.accumulate(math.comb(100, k) / 2**100 for k in range(101)))
    quantile_low = next(k for k, p in enumerate(cdf) if p >= 0.025) / 100
    quantile_high = next(k for k, p in enumerate(cdf) if p >= 0.975) / 100
    assert (quantile_low, quantile_high) == (0.40, 0.60)
    mean, low, high = learning.paired_ci(before, after)
    assert mean == 0.5
    assert low == pytest.approx(quantile_low, abs=0.0101) and high == pytest.approx(quantile_high, abs=0.0101)

    assert learning.paired_ci(before, after, seed=3) == learning.paired_ci(before, after, seed=3)
    assert learning.paired_ci([1.0] * 20, [3.5] * 20) == (2.5, 2.5, 2.5)  # no spread, no width
    _, fewer_low, fewer_high = learning.paired_ci(before[:20], after[40:60])  # 20 prompts, same mean
    assert high - low < 0.6 * (fewer_high - fewer_low)  # five times the prompts: about 1/sqrt(5) of the width


def test_paired_t_halfwidth(learning: ModuleType) -> None:
    # differences 1, 2, 3, 4: sample sd sqrt(5/3), so 1.96 * sqrt(5/3) / 2
    assert learning.paired_t_halfwidth([0.0] * 4, [1.0, 2.0, 3.0, 4.0]) == pytest.approx(1.96 * math.sqrt(5 / 3) / 2)
    assert math.isnan(learning.paired_t_halfwidth([0.0], [1.0]))


def test_phases_account_for_the_whole_wall_time(learning: ModuleType) -> None:
    spent = learning.phase_seconds(100.0, {"load": 20.0, "sft": 0.0, "rollouts": 30.04, "training": 45.0})
    assert spent == {"load": 20.0, "rollouts": 30.0, "training": 45.0, "other": 5.0, "wall": 100.0}  # no SFT: left out
    assert learning.phase_line(spent) == (
        "seconds by phase: load 20.0 (20%), rollouts 30.0 (30%), training 45.0 (45%); other 5.0; wall 100.0"
    )


@pytest.mark.slow  # a whole run on the tiny model; CI runs it with -m slow
def test_one_step_on_the_tiny_model(tmp_path: Path) -> None:
    out, scratch = tmp_path / "result.json", tmp_path / "tmp"
    scratch.mkdir()
    command = [
        sys.executable, str(SCRIPT), "--tiny", "--steps", "1", "--eval-limit", "4", "--prompts-per-step", "2",
        "--group-size", "2", "--max-tokens", "6", "--lora-rank", "4", "--json-out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(scratch)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "compound reward" in done.stdout and "correctness" in done.stdout and "Q: " in done.stdout
    summary = json.loads(out.read_text())
    assert summary["steps"] == 1
    phases = ("load", "base_evaluation", "rollouts", "training", "final_evaluation", "other", "wall")
    assert tuple(summary["phases"]) == phases and "seconds by phase: load " in done.stdout
    assert len(summary["per_prompt"]["before"]) == len(summary["per_prompt"]["after"]) == 4
    assert (
        summary["heldout"]["reward"]["ci95"][0]
        <= summary["heldout"]["reward"]["diff"]
        <= summary["heldout"]["reward"]["ci95"][1]
    )
    assert f"art path {scratch}" in done.stdout  # without --art-path, a temporary folder...
    assert not list(scratch.glob("art-*"))  # ...removed at the end (torch keeps its shared cache folder there)

"""benchmarks/timing.py on fake sides, and smoke runs of the serving and loop overhead scripts on the tiny model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from types import ModuleType

import pytest
from benchmark_scripts import BENCHMARKS, load_benchmark


@pytest.fixture(scope="module")
def timing() -> ModuleType:
    return load_benchmark("timing")


def test_sides_run_interleaved_after_warmup_and_report_their_own_seconds(timing: ModuleType) -> None:
    calls: list[str] = []
    measured = iter([9.0, 1.0, 3.0, 2.0])  # the warm-up round's 9.0 is dropped

    def a() -> float:
        calls.append("a")
        return next(measured)

    def b() -> None:
        calls.append("b")

    summaries = timing.interleaved({"a": a, "b": b}, rounds=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert (summaries["a"].median, summaries["a"].low, summaries["a"].high, summaries["a"].runs) == (2.0, 1.0, 3.0, 3)
    assert summaries["b"].runs == 3 and 0 <= summaries["b"].low <= summaries["b"].high < 1  # wall clock


def test_summary_formats_median_range_and_runs(timing: ModuleType) -> None:
    summary = timing.Summary.of([0.0130, 0.0119, 0.0123, 0.0125, 0.0121])
    assert summary.format() == "12.3 ms (11.9-13.0, 5 runs)"
    assert str(summary.scaled(1 / 10)) == "1.2 ms (1.2-1.3, 5 runs)"
    with pytest.raises(ValueError, match="no measurements"):
        timing.Summary.of([])


def test_ratio_is_the_median_of_per_round_ratios(timing: ModuleType) -> None:
    slow_round_on_both = timing.ratio(timing.Summary.of([2.0, 20.0, 3.0]), timing.Summary.of([1.0, 10.0, 2.0]))
    assert slow_round_on_both.format("x", 1, 2) == "2.00x (1.50-2.00, 3 runs)"
    with pytest.raises(ValueError, match="paired"):
        timing.ratio(timing.Summary.of([1.0]), timing.Summary.of([1.0, 2.0]))


def run_script(name: str, *args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


RATIO = r"\d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d, \d+ runs\)"


@pytest.mark.slow
def test_serving_overhead_runs_on_the_tiny_model() -> None:
    out = run_script("serving_overhead.py", "--rounds", "1", "--max-tokens", "8", "--prompts", "8")
    summary = next(line for line in out.splitlines() if line.startswith("summary"))
    assert re.search(rf"concurrent {RATIO} \[target <= 1\.3x: (met|missed)\]", summary), summary
    assert re.search(rf"n=8 {RATIO} \[target <= 1\.2x: (met|missed)\]", summary), summary
    assert re.search(rf"concurrent vs generate {RATIO}; .*sequential {RATIO}", summary), summary
    assert re.search(rf"concurrent prefix cache on / off {RATIO} \[goal <= 1\.05x\]", summary), summary
    batching = next(line for line in out.splitlines() if line.startswith("batching"))
    assert re.search(rf"concurrent server {RATIO} \[goal <= 2\.0x: (met|missed)\]; concurrent bare {RATIO}", batching)
    assert re.search(rf"n=8 server {RATIO} \[goal <= 1\.6x: (met|missed)\]; n=8 bare {RATIO}$", batching), batching


@pytest.mark.slow
def test_protocols_benchmark_times_every_protocol_against_chat() -> None:
    out = run_script("protocols.py", "--rounds", "1", "--max-tokens", "4", "--concurrent", "2")
    for scenario in ("1 at once", "2 at once"):
        block = out.split(scenario, 1)[1]
        for name in ("responses", "messages"):
            assert re.search(rf"{name} .* {RATIO}  (meets|misses) <= 1\.1x", block), block
        assert re.search(rf"completions .* {RATIO}\n", block), block


@pytest.mark.slow
def test_serving_precision_benchmark_times_bf16_and_int8_against_fp32() -> None:
    out = run_script("serving_precision.py", "--rounds", "1", "--max-tokens", "4", "--concurrent", "1", "8")
    for scenario in ("1 at once", "8 at once"):
        block = out.split(scenario, 1)[1]
        for precision in ("bfloat16", "int8"):
            assert re.search(rf"{precision} .* ms .* {RATIO}", block), block
    assert re.search(rf"int8 .* {RATIO}  (meets|misses) <= 0\.5x", out.split("8 at once", 1)[1])


@pytest.mark.slow
def test_loop_overhead_runs_on_the_tiny_model() -> None:
    out = run_script("loop_overhead.py", "--tiny", "--steps", "1", "--prompts", "2", "--group-size", "2")
    assert re.search(r"^art .*rollout \d+\.\d+, scoring \d+\.\d+, train \d+\.\d+, checkpoint", out, re.M), out
    assert re.search(rf"^summary \(art / bare, per step\): {RATIO} \[goal <= 1\.3x: (met|missed)\]$", out, re.M), out


@pytest.mark.slow
def test_prefix_cache_runs_on_the_tiny_model() -> None:
    out = run_script("prefix_cache.py", "--model", "tiny", "--rounds", "1", "--turns", "2", "--head-tokens", "100")
    summary = next(line for line in out.splitlines() if line.startswith("summary"))
    assert re.search(
        rf"group {RATIO} \[goal <= 0\.3x: (met|missed)\]; prefill tokens computed per rollout \d+ vs \d+", summary
    ), summary
    assert re.search(rf"conversation {RATIO} \[goal <= 0\.4x: (met|missed)\]", summary), summary


@pytest.mark.slow
def test_async_pipeline_runs_on_the_tiny_model() -> None:
    out = run_script("async_pipeline.py", "--shape", "tiny", "--rounds", "1", "--steps", "2", "--in-process")
    for kind in ("tool", "judge"):
        summary = next(line for line in out.splitlines() if line.startswith(f"summary {kind}"))
        assert re.search(rf"pipelined / synchronous {RATIO} \[goal <= 0\.6x: (met|missed)\]", summary), summary
        assert re.search(r"trainer waited \d+\.\d\d s, rollouts held \d+\.\d\d s", summary), summary


@pytest.mark.slow
def test_train_memory_reads_the_servers_resident_memory_through_registering_and_training() -> None:
    out = run_script(
        "train_memory.py", "--tiny", "--steps", "1", "--groups", "1", "--group-size", "2", "--system-tokens", "60",
        "--micro-batch-size", "1",
    )  # fmt: skip
    result = json.loads(out[out.index("{") :])
    assert result["steps"] == 1 and 0 < result["rss_mb_registered"] <= result["rss_mb_peak"]
    assert result["rss_mb_after_steps"] <= result["rss_mb_peak"]


@pytest.mark.slow
def test_grpo_step_reports_time_and_peak_memory_of_every_side() -> None:
    out = run_script(
        "grpo_step.py", "--steps", "1", "--groups", "2", "--group-size", "4", "--prompt-tokens", "40",
        "--against", "per-row", "full-head", "trl",
    )  # fmt: skip
    for side in ("per-row", "full-head", "trl"):
        assert re.search(rf"^ours / {side}: time {RATIO}, peak memory {RATIO}$", out, re.M), out
    assert re.search(r"PolicyTrainer\.train: .* per step, peak \d+\.\d MiB \(", out), out


@pytest.mark.slow
def test_first_requests_runs_on_the_tiny_model() -> None:
    out = run_script("first_requests.py", "--tiny", "--runs", "1", "--busy", "1", "--batches", "3", "--max-tokens", "4")
    for condition in ("quiet", "busy"):
        for side in ("shipped", "spinning", "passive"):
            assert re.search(
                rf"^{condition} {side}: first batch .* first / batch 3 {RATIO} \[goal <= 1\.3x: (met|missed)\]$",
                out,
                re.M,
            ), out
        assert re.search(
            rf"^summary {condition}, all batches of a run: spinning / shipped {RATIO}; passive / shipped {RATIO}$",
            out,
            re.M,
        ), out


@pytest.mark.slow
def test_replicas_benchmark_runs_on_the_tiny_model() -> None:
    out = run_script("replicas.py", "--tiny", "--rounds", "1", "--requests", "4", "--max-tokens", "4")
    assert re.search(rf"^summary: throughput 2 replicas / 1 {RATIO}$", out, re.M), out

"""`art.evaluate` against scripted OpenAI-compatible endpoints standing for frontier models: per-model results,
pairwise paired-bootstrap comparisons checked against a direct computation, failures counted, resumption, the
decoding and pinned model set in requests, and bad models refused in one line before anything runs."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
from scripted_openai import ScriptedOpenAI

import art_agents as art
from art_agents.errors import SetupError
from art_agents.evaluation.comparison import compare_pair, paired_ci

SCENARIOS = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(6)]


def answering(correct: set[int]) -> Any:
    """A scripted model that answers the questions numbered in `correct` right and the others wrong."""

    def reply(body: dict[str, Any]) -> str:
        number = int(body["messages"][-1]["content"].split()[2])
        return str(2 * number) if number in correct else "no idea"

    return reply


async def rollout(model: art.Model, scenario: dict[str, Any]) -> art.Trajectory:
    client = model.openai_client()
    async with art.rollout(scenario=scenario["id"]) as trajectory:
        reply = await client.chat.completions.create(
            model=model.served_name, messages=[{"role": "user", "content": scenario["question"]}], temperature=0.7
        )
        trajectory.reward = float(reply.choices[0].message.content == scenario["answer"])
        trajectory.metrics["chars"] = len(reply.choices[0].message.content or "")
    await client.close()
    return trajectory


@pytest.fixture
def frontier() -> Any:
    with ScriptedOpenAI(model_suffix="") as good, ScriptedOpenAI(model_suffix="") as weak:
        good.default = answering({0, 1, 2, 3, 4})
        weak.default = answering({0, 1})
        yield good, weak


async def test_models_are_compared_on_the_same_scenarios(frontier: Any, tmp_path: Path) -> None:
    good, weak = frontier
    models = [
        art.Model(name="weak-model", inference_base_url=weak.base_url),
        "openai/gpt-4.1-mini",  # LiteLLM's name, pointed at the scripted endpoint: priced by LiteLLM's map
    ]
    result = await art.evaluate(
        rollout,
        SCENARIOS,
        models,
        out=tmp_path,
        rollouts_per_scenario=2,
        decoding="greedy",
        litellm_params={"openai/gpt-4.1-mini": {"api_base": good.base_url, "api_key": "sk-test"}},
        pbar_desc=None,
    )
    weak_summary, good_summary = result.summary.models
    assert (weak_summary.model, weak_summary.mean_reward, weak_summary.failed_scenarios) == ("weak-model", 2 / 6, 0)
    assert (good_summary.model, good_summary.mean_reward) == ("openai/gpt-4.1-mini", 5 / 6)
    assert good_summary.prompt_tokens == 6 * 2 * 10 and good_summary.completion_tokens == 6 * 2 * 5  # scripted usage
    assert good_summary.cost_usd is not None and good_summary.cost_usd > 0  # LiteLLM has gpt-4.1-mini's price
    assert weak_summary.cost_usd is None  # no price: unknown, not 0
    assert good_summary.metrics["chars"] > 0 and good_summary.latency_s > 0
    assert len(result.trajectories("openai/gpt-4.1-mini")) == 12
    # the scenario's rollouts ran greedily and under the provider's own model name, whatever the rollout asked
    assert {(r["temperature"], r["model"]) for r in good.requests} == {(0.0, "gpt-4.1-mini")}
    assert {r["temperature"] for r in weak.requests} == {0.0}

    (pair,) = result.summary.comparisons
    assert (pair.model, pair.baseline, pair.paired) == ("openai/gpt-4.1-mini", "weak-model", 6)
    assert (pair.wins, pair.losses, pair.ties, pair.win_rate) == (3, 0, 3, (3 + 3 / 2) / 6)
    assert (pair.mean_difference, pair.ci_low, pair.ci_high) == paired_ci([1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0])

    saved = json.loads((tmp_path / "eval" / "heldout" / "summary.json").read_text())
    assert saved["models"][1]["file"] == "openai__gpt-4.1-mini.jsonl"
    lines = (tmp_path / "eval" / "heldout" / "openai__gpt-4.1-mini.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["scenario_id"] for line in lines) == [s["id"] for s in SCENARIOS]


def test_the_paired_interval_is_a_percentile_bootstrap_over_scenarios() -> None:
    rng = random.Random(7)
    baseline = {f"s{i}": rng.random() for i in range(40)}
    model = {k: min(1.0, v + rng.gauss(0.1, 0.2)) for k, v in baseline.items()}
    pair = compare_pair("m", "b", dict(model), dict(baseline))
    # the same statistic computed directly: resample scenarios with replacement, take the 2.5% and 97.5% means
    diffs = [model[k] - baseline[k] for k in baseline]
    draw = random.Random(1)
    means = sorted(statistics.fmean(draw.choices(diffs, k=len(diffs))) for _ in range(20_000))
    assert pair.mean_difference == pytest.approx(statistics.fmean(diffs))
    assert pair.ci_low == pytest.approx(means[500], abs=0.01) and pair.ci_high == pytest.approx(means[19_499], abs=0.01)
    assert pair.ci_low < pair.mean_difference < pair.ci_high
    # a failed scenario of either model leaves the pairs and is counted on its side
    failed = compare_pair("m", "b", {**model, "s0": None}, {**baseline, "s1": None, "s2": None})
    assert (failed.paired, failed.model_failed, failed.baseline_failed) == (37, 1, 2)


async def test_failing_scenarios_are_counted_and_an_interrupted_run_resumes(frontier: Any, tmp_path: Path) -> None:
    good, _ = frontier
    calls: list[str] = []
    release = asyncio.Event()

    async def flaky(model: art.Model, scenario: dict[str, Any]) -> art.Trajectory:
        calls.append(scenario["id"])
        if scenario["id"] == "q5":
            raise RuntimeError("the tool server fell over")
        if scenario["id"] == "q4":
            await release.wait()  # still running when the evaluation is interrupted
        return await rollout(model, scenario)

    model = art.Model(name="good", inference_base_url=good.base_url)
    options: dict[str, Any] = {"out": tmp_path, "concurrency": 2, "pbar_desc": None}
    task = asyncio.create_task(art.evaluate(flaky, SCENARIOS, [model], **options))
    file = tmp_path / "eval" / "heldout" / "good.jsonl"
    while len(file.read_text().splitlines() if file.exists() else []) < 5:  # all but q4 finished and saved
        await asyncio.sleep(0.01)
    task.cancel()  # interrupted with q4 unfinished
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(json.loads(line)["scenario_id"] for line in file.read_text().splitlines()) == [
        "q0",
        "q1",
        "q2",
        "q3",
        "q5",
    ]

    calls.clear()
    release.set()
    result = await art.evaluate(flaky, SCENARIOS, [model], **options)
    assert sorted(calls) == ["q4", "q5"]  # the finished ones are not run again; the failed one is tried again
    summary = result.model("good")
    assert (summary.scenarios, summary.failed_scenarios, summary.failed_rollouts) == (6, 1, 1)
    assert summary.mean_reward == 1.0  # over the 5 scenarios that ran (q0-q4 are all right)
    assert summary.first_error == "RuntimeError: the tool server fell over"


async def test_an_error_every_rollout_would_hit_stops_the_evaluation_and_records_nothing(
    frontier: Any, tmp_path: Path
) -> None:
    good, _ = frontier
    cancelled: list[str] = []

    async def judge_down(model: art.Model, scenario: dict[str, Any]) -> art.Trajectory:
        if scenario["id"] != "q0":
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(scenario["id"])
                raise
        raise SetupError("judge 'openai/judge' could not be reached; check that the judge is running")

    model = art.Model(name="good", inference_base_url=good.base_url)
    with pytest.raises(SetupError, match="could not be reached"):
        await art.evaluate(judge_down, SCENARIOS, [model], out=tmp_path, pbar_desc=None)
    assert sorted(cancelled) == ["q1", "q2", "q3", "q4", "q5"]  # the others were stopped, not left running
    assert not (tmp_path / "eval").exists()  # not recorded as the model's failed scenarios


async def test_retries_and_timeouts_bound_each_rollout(frontier: Any) -> None:
    good, _ = frontier
    tries: dict[str, int] = {}

    async def slow_then_fine(model: art.Model, scenario: dict[str, Any]) -> art.Trajectory:
        tries[scenario["id"]] = tries.get(scenario["id"], 0) + 1
        if tries[scenario["id"]] == 1:
            await asyncio.sleep(60)  # the first try hangs: the timeout ends it, the retry answers
        return await rollout(model, scenario)

    model = art.Model(name="good", inference_base_url=good.base_url)
    # the timeout bounds the retry too: 3 s leaves a loopback call room on a loaded machine (0.2 s did not)
    result = await art.evaluate(
        slow_then_fine, SCENARIOS[:2], [model], retries=1, retry_delay_s=0, timeout_s=3, pbar_desc=None
    )
    assert tries == {"q0": 2, "q1": 2} and result.folder is None  # no run folder and no out: nothing saved
    assert result.model("good").failed_rollouts == 0 and result.model("good").mean_reward == 1.0


async def test_bad_models_are_named_in_one_line_before_anything_runs(monkeypatch: Any) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    ran: list[str] = []

    async def never(model: art.Model, scenario: Any) -> art.Trajectory:
        ran.append(model.name)
        raise AssertionError("no rollout may start")

    models = ["openai/gpt-4.1-mini", "nothing@http://127.0.0.1:9/v1", "mystery", "ours@3"]
    with pytest.raises(SetupError) as caught:
        await art.evaluate(never, SCENARIOS, models, pbar_desc=None)
    message = str(caught.value)
    assert "\n" not in message and not ran
    assert "'openai/gpt-4.1-mini' needs an API key: set OPENAI_API_KEY" in message
    assert "'mystery' is not a model evaluate knows" in message
    assert "'ours@3': no TrainableModel named 'ours'" in message

    with pytest.raises(SetupError, match=r"'nothing@http://127.0.0.1:9/v1' is unreachable at http://127.0.0.1:9/v1"):
        await art.evaluate(never, SCENARIOS, ["nothing@http://127.0.0.1:9/v1"], pbar_desc=None)
    assert not ran


def test_the_eval_command_runs_a_job_files_rollout(frontier: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from typer.testing import CliRunner

    from art_agents.cli.main import app, load_parts

    good, _ = frontier
    (tmp_path / "qa_rollout.py").write_text(
        "from test_evaluate import rollout\n"  # the rollout above, imported by the job's `module:function`
    )
    (tmp_path / "job.toml").write_text(
        'name = "agent"\nbase_model = "unused"\nrollout = "qa_rollout:rollout"\nscenarios = "train.jsonl"\n'
    )
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(s) + "\n" for s in SCENARIOS))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    load_parts()
    arguments = ["eval", str(tmp_path / "job.toml"), "--scenarios", str(tmp_path / "heldout.jsonl")]
    result = CliRunner().invoke(app, [*arguments, "--models", f"good@{good.base_url}", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert any(line.startswith(f"good@{good.base_url} ") for line in result.output.splitlines())  # its table row
    summary = json.loads((tmp_path / "eval" / "heldout" / "summary.json").read_text())
    assert [(m["scenarios"], m["mean_reward"]) for m in summary["models"]] == [(6, pytest.approx(5 / 6))]

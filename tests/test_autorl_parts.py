"""AutoRL's parts on their own: the curriculum's draws and retirements, the pairwise judge, the config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ruler_fixtures import judge_params
from scripted_openai import ScriptedOpenAI

from art_agents import Trajectory, TrajectoryGroup
from art_agents.autorl.curriculum import Curriculum, PoolInput
from art_agents.autorl.from_description import AutoRLConfig
from art_agents.autorl.scoring import GroupScorer
from art_agents.autorl.versus_base import judge_versus_first
from art_agents.evaluation import EvalSummary, Evaluation, ModelSummary, ScenarioRun, compare_pair
from art_agents.ruler import RulerError
from art_agents.ruler.pairwise import compare_answers


def pool(count: int) -> list[PoolInput]:
    return [PoolInput(id=f"i{n:04d}", input=f"input number {n}", difficulty=1) for n in range(count)]


def group(input_id: str, rewards: list[float]) -> TrajectoryGroup:
    return TrajectoryGroup(Trajectory(reward=r, metadata={"scenario_id": input_id}) for r in rewards)


def test_the_curriculum_draws_the_least_trained_inputs_and_retires_flat_ones() -> None:
    curriculum = Curriculum(pool(4), retire_after=2, seed=1)
    first = curriculum.pick(0, 2)
    curriculum.observe([group(first[0].id, [1.0, 1.0]), group(first[1].id, [0.2, 0.9])])
    second = curriculum.pick(1, 2)
    assert {e.id for e in second}.isdisjoint(e.id for e in first)  # never-drawn inputs come first
    assert curriculum.due() == []  # one flat draw is not enough with retire_after=2
    curriculum.observe([group(first[0].id, [0.5, 0.5])])
    assert [e.id for e in curriculum.due()] == [first[0].id]
    curriculum.retire(curriculum.due(), step=3)
    assert first[0].id not in {e.id for e in curriculum.active} and first[0].retired_at_step == 3
    curriculum.add([PoolInput(id="i0004", input="a new one", difficulty=3, added_at_step=3)])
    assert len(curriculum.active) == 4 and len(curriculum.pool) == 5
    focus = curriculum.focus()
    assert "does poorly on inputs like these" in focus and "input number" in focus
    assert "already handles" in focus and first[0].input in focus.split("already handles")[1]


def test_the_curriculum_repeats_inputs_when_the_pool_is_smaller_than_a_draw() -> None:
    assert len(Curriculum(pool(2), retire_after=1).pick(0, 5)) == 5
    empty = Curriculum(pool(1), retire_after=1)
    empty.retire(empty.pool, 1)
    with pytest.raises(ValueError, match="no active inputs"):
        empty.pick(0, 1)


def first_shown_wins(body: dict[str, Any]) -> str:
    return json.dumps({"explanation": "position 1", "better": "1"})


def answered(answers: dict[str, dict[str, str | None]]) -> Evaluation:
    """An evaluation whose models (first the base) answered each scenario as given; None: its rollout failed."""
    runs = {
        label: [
            ScenarioRun(scenario_id=i, index=n, rewards=[] if a is None else [0.5],
                        trajectories=[] if a is None else [Trajectory(reward=0.5, metadata={"answer": a})])
            for n, (i, a) in enumerate(given.items())
        ]
        for label, given in answers.items()
    }  # fmt: skip
    rewards = {label: {r.scenario_id: r.reward for r in rs} for label, rs in runs.items()}
    labels = list(answers)
    summary = EvalSummary(
        name="heldout", scenarios=len(answers[labels[0]]), rollouts_per_scenario=1, decoding="greedy",
        models=[ModelSummary(model=label, file=f"{label}.jsonl", scenarios=len(runs[label]), failed_scenarios=0,
                             failed_rollouts=0, mean_reward=0.5) for label in labels],
        comparisons=[compare_pair(labels[j], labels[i], rewards[labels[j]], rewards[labels[i]])
                     for j in range(len(labels)) for i in range(j)],
    )  # fmt: skip
    return Evaluation(summary=summary, runs=runs)


async def test_a_pairwise_judge_that_favours_a_position_cannot_favour_a_model(scripted: ScriptedOpenAI) -> None:
    scripted.default = first_shown_wins
    params = judge_params(scripted)
    params.pop("cache_dir")
    ids = [f"e{n}" for n in range(12)]
    evaluation = answered({"agent@0": {i: f"base {i}" for i in ids}, "agent@4": dict.fromkeys(ids, "new")})
    scorer = GroupScorer({}, judge_model=params.pop("judge_model"), rubric="Be right.", judge_params=params)
    judged = await judge_versus_first(evaluation, {i: f"request {i}" for i in ids}, scorer, seed=3)
    versus = judged.summary.comparisons[0].judged
    assert versus is not None and versus.wins + versus.losses == 12 and versus.ties == 0
    assert versus.wins > 0 and versus.losses > 0  # the shuffle put each model first some of the time
    shown_first = [r["messages"][1]["content"].split("Answer 1:\n")[1].split("\n")[0] for r in scripted.requests]
    assert sum(text == "new" for text in shown_first) == versus.wins
    assert scorer.prompt_tokens == 12 * 10 and scorer.cost_known is False  # the scripted judge has no price


async def test_a_missing_answer_loses_without_asking_the_judge(scripted: ScriptedOpenAI) -> None:
    params = judge_params(scripted)
    params.pop("cache_dir")
    failed = {"e0": None, "e1": None}
    evaluation = answered({"agent@0": {"e0": "x", "e1": None}, "agent@2": failed, "agent@3": failed})
    scorer = GroupScorer({}, judge_model=params.pop("judge_model"), judge_params=params)
    judged = await judge_versus_first(evaluation, {"e0": "a", "e1": "b"}, scorer)
    versus = {(c.model, c.baseline): c.judged for c in judged.summary.comparisons}
    first = versus["agent@2", "agent@0"]
    assert first is not None and (first.wins, first.losses, first.ties) == (0, 1, 1)
    assert first.win_rate == 0.25 and scripted.requests == []
    assert versus["agent@3", "agent@2"] is None  # only the comparisons against the first model (the base)


async def test_a_pairwise_answer_out_of_format_is_asked_again_then_fails_clearly(scripted: ScriptedOpenAI) -> None:
    scripted.replies = ["I like the first one", json.dumps({"better": "Answer 2", "explanation": "clearer"})]
    params = judge_params(scripted)
    params.pop("cache_dir")
    judged = await compare_answers(params.pop("judge_model"), "q", "mine", "theirs", "Be right.", swap=False, **params)
    assert judged.outcome == "loss" and len(judged.calls) == 2
    assert "better" in scripted.requests[1]["messages"][-1]["content"]  # the re-ask names the format
    scripted.default = "never JSON"
    with pytest.raises(RulerError, match="gave no usable answer in 3 attempts"):
        await compare_answers("openai/judge", "q", "a", "b", "r", api_base=scripted.base_url, api_key="k")


def test_the_toml_form_and_a_task_file(tmp_path: Path) -> None:
    path = tmp_path / "autorl.toml"
    path.write_text(
        'task = "Write a haiku about the given topic, 5-7-5 syllables."\nbase_model = "Qwen/Qwen3-0.6B"\n'
        'judge_model = "openai/gpt-4.1-mini"\nsteps = 20\nout = "runs/haiku"\n[rollout]\nmax_tokens = 64\n'
    )
    config = AutoRLConfig.load(path, {"steps": 5, "rollout": {"max_tokens": None}, "out": None})
    assert config.steps == 5 and config.rollout.max_tokens == 64 and config.out == tmp_path / "runs" / "haiku"
    assert config.generation_params() == ("openai/gpt-4.1-mini", {})
    with pytest.raises(ValueError, match="task description is empty"):
        AutoRLConfig(task="", base_model="m")


def test_the_cost_benchmark_counts_the_prompts_the_pipeline_renders() -> None:
    import subprocess
    import sys

    script = Path(__file__).parent.parent / "benchmarks" / "autorl_cost.py"
    result = subprocess.run(
        [sys.executable, str(script), "--answer-tokens", "40"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    rows = {line[:48].strip(): line[48:].split() for line in result.stdout.splitlines()[2:]}
    prompt, completion, usd = rows["judge, one training step (4 groups of 4)"]
    assert int(prompt) > 4 * 4 * 40 and int(completion) > 0 and float(usd) > 0

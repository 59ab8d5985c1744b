"""RULER through LiteLLM against a loopback OpenAI-compatible judge with scripted answers."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from ruler_fixtures import (
    answer,
    conversation,
    judge_by_position,
    judge_by_quality,
    judge_params,
    make_group,
    shown,
)
from scripted_openai import ScriptedOpenAI

from art_agents import Trajectory, TrajectoryGroup, gather_trajectory_groups
from art_agents.ruler import ruler, ruler_score_group
from art_agents.wire import reward_stats


async def test_scores_land_on_the_right_trajectories_across_shuffled_passes(scripted: ScriptedOpenAI) -> None:
    qualities = [0.2, 0.9, 0.5, 0.0, 0.7]
    scripted.default = judge_by_quality
    group = make_group(qualities)
    scored = await ruler_score_group(group, passes=3, **judge_params(scripted))

    assert scored is not None and scored is not group
    assert scored.rewards() == pytest.approx(qualities)
    assert group.rewards() == [10.0, 11.0, 12.0, 13.0, 14.0]  # the input group is untouched
    for index, trajectory in enumerate(scored.trajectories):
        assert trajectory.metrics["independent_reward"] == 10.0 + index
        assert trajectory.metrics["ruler_score"] == pytest.approx(qualities[index])
        assert trajectory.metrics["ruler_agreement"] == 1.0
        assert (
            len(trajectory.logs) == 3
            and f"pass 3/3) score {qualities[index]:.3f}: judged t{index + 1}" in trajectory.logs[2]
        )
    orders = [[i for i, _ in shown(body)] for body in scripted.requests]
    assert len(orders) == 3 and len({tuple(o) for o in orders}) == 3  # three different presentation orders
    ids = ["t1", "t2", "t3", "t4", "t5"]
    assert ids in orders and ids[::-1] in orders  # passes run concurrently, so requests arrive in any order
    assert scored.metadata["ruler"]["agreement_kendall_tau"] == 1.0


async def test_position_biased_judge_shows_as_disagreement(scripted: ScriptedOpenAI) -> None:
    scripted.default = judge_by_position
    scored = await ruler_score_group(make_group([0.1, 0.5, 0.9]), passes=2, **judge_params(scripted))
    assert scored is not None
    assert scored.rewards() == [0.5, 0.5, 0.5]  # forward and reversed passes cancel
    assert scored.trajectories[0].metrics["ruler_agreement"] == -1.0


async def test_request_carries_schema_prefix_once_and_passthrough_params(scripted: ScriptedOpenAI) -> None:
    scripted.default = judge_by_quality
    lists = [conversation("What is 6 * 7?", q, turns=3) for q in (0.3, 0.6)]
    result = await ruler(lists, **judge_params(scripted, temperature=0.25, rubric="Prefer correct answers."))
    assert result.scores == [0.3, 0.6] and result.ids == ["t1", "t2"]
    body = scripted.requests[0]
    assert body["temperature"] == 0.25
    assert scripted.headers[0]["authorization"] == "Bearer sk-test"
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["scores"]["items"]["properties"]["trajectory_id"]["enum"] == ["t1", "t2"]
    assert "Prefer correct answers." in body["messages"][0]["content"]
    assert body["messages"][1]["content"].count("What is 6 * 7?") == 1


async def test_response_format_none_sends_no_schema(scripted: ScriptedOpenAI) -> None:
    scripted.default = judge_by_quality
    await ruler([conversation("t", 0.1), conversation("t", 0.2)], response_format=None, **judge_params(scripted))
    assert "response_format" not in scripted.requests[0]


async def test_tokens_and_cost_per_call() -> None:
    import litellm

    with ScriptedOpenAI(model_suffix="") as server:  # answers as "gpt-4o-mini", a model LiteLLM has prices for
        server.default = judge_by_quality
        priced = await ruler_score_group(
            make_group([0.1, 0.8]), **judge_params(server, judge_model="openai/gpt-4o-mini")
        )
        unpriced = await ruler_score_group(make_group([0.1, 0.8]), **judge_params(server))
    assert priced is not None and unpriced is not None
    prompt_cost, completion_cost = litellm.cost_per_token(model="gpt-4o-mini", prompt_tokens=10, completion_tokens=5)
    summary = priced.metadata["ruler"]
    assert summary["prompt_tokens"] == 10 and summary["completion_tokens"] == 5  # the scripted server's usage
    assert summary["cost_usd"] == pytest.approx(prompt_cost + completion_cost) and summary["cost_known"]
    assert [c["attempt"] for c in summary["calls"]] == [1]
    assert sum(t.metrics["ruler_cost_usd"] for t in priced.trajectories) == pytest.approx(summary["cost_usd"])
    assert unpriced.metadata["ruler"]["cost_usd"] == 0.0 and not unpriced.metadata["ruler"]["cost_known"]
    assert not any("ruler_cost_usd" in t.metrics for t in unpriced.trajectories)  # unknown, not $0
    assert "judge_cost_usd" in reward_stats([priced]) and "judge_cost_usd" not in reward_stats([priced, unpriced])


async def test_cache_hits_on_rerun_and_misses_on_a_new_rubric(scripted: ScriptedOpenAI, tmp_path: Path) -> None:
    scripted.default = judge_by_quality
    params = judge_params(scripted, cache_dir=tmp_path)
    first = await ruler_score_group(make_group([0.3, 0.6, 0.9]), **params)
    again = await ruler_score_group(make_group([0.3, 0.6, 0.9]), **params)
    assert len(scripted.requests) == 1
    assert first is not None and again is not None and again.rewards() == first.rewards() == [0.3, 0.6, 0.9]
    assert again.metadata["ruler"]["calls"][0]["cached"] and again.metadata["ruler"]["cost_usd"] == 0.0
    assert again.trajectories[0].metrics["ruler_judge_calls"] == 0

    await ruler_score_group(make_group([0.3, 0.6, 0.9]), rubric="Only correctness counts.", **params)
    await ruler_score_group(make_group([0.3, 0.6, 0.9]), **{**params, "judge_model": "openai/other-judge"})
    await ruler_score_group(make_group([0.3, 0.6, 0.8]), **params)
    assert len(scripted.requests) == 4
    await ruler_score_group(make_group([0.3, 0.6, 0.9]), passes=2, **params)  # pass 1 cached, pass 2 is new
    assert len(scripted.requests) == 5
    assert not list(tmp_path.rglob(".tmp-*"))


async def test_corrupt_cache_entry_is_a_miss(scripted: ScriptedOpenAI, tmp_path: Path) -> None:
    scripted.default = judge_by_quality
    params = judge_params(scripted, cache_dir=tmp_path)
    await ruler_score_group(make_group([0.3, 0.6]), **params)
    (entry,) = tmp_path.rglob("*.json")
    entry.write_text("{half", encoding="utf-8")
    scored = await ruler_score_group(make_group([0.3, 0.6]), **params)
    assert scored is not None and scored.rewards() == [0.3, 0.6] and len(scripted.requests) == 2
    assert json.loads(entry.read_text(encoding="utf-8"))["judge_model"] == "openai/judge"  # rewritten


async def test_tools_reach_the_judge(scripted: ScriptedOpenAI) -> None:
    scripted.default = judge_by_quality
    tool = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    group = TrajectoryGroup(Trajectory(messages=conversation("t", q), tools=[tool]) for q in (0.2, 0.4))
    await ruler_score_group(group, **judge_params(scripted))
    assert scripted.requests[0]["messages"][1]["content"].count('"name": "calculator"') == 1


async def test_empty_group_is_returned_as_is(scripted: ScriptedOpenAI) -> None:
    scored = await ruler_score_group(TrajectoryGroup(), **judge_params(scripted))
    assert scored is not None and scored.trajectories == [] and scripted.requests == []


async def rollout_for(task: str, quality: float) -> Trajectory:
    return Trajectory(messages=conversation(task, quality), reward=1.0)


def judge_refusing(task: str) -> Any:
    def reply(body: dict[str, Any]) -> str:
        return "I cannot judge this." if task in body["messages"][1]["content"] else judge_by_quality(body)

    return reply


async def test_after_each_in_a_gather_over_four_groups(scripted: ScriptedOpenAI) -> None:
    scripted.default = judge_refusing("task 2")
    qualities = [[0.1, 0.4, 0.8], [0.9, 0.3, 0.0], [0.5, 0.6, 0.2], [0.35, 0.65, 0.95]]
    groups = [TrajectoryGroup(rollout_for(f"task {g}", q) for q in qualities[g]) for g in range(4)]
    scorer = functools.partial(ruler_score_group, swallow_exceptions=True, max_attempts=2, **judge_params(scripted))
    finished = await gather_trajectory_groups(groups, after_each=scorer, pbar_desc=None)

    assert [g.rewards() for g in finished] == [qualities[0], qualities[1], qualities[3]]  # task 2 dropped
    assert all(t.metrics["independent_reward"] == 1.0 for g in finished for t in g.trajectories)
    assert len(scripted.requests) == 3 + 2  # one call per good group, two attempts for the dropped one


async def test_answer_can_be_in_any_order(scripted: ScriptedOpenAI) -> None:
    scripted.default = lambda body: answer(sorted(((i, 0.5) for i, _ in shown(body)), reverse=True))
    result = await ruler(
        [conversation("t", 0.1), conversation("t", 0.2), conversation("t", 0.3)], **judge_params(scripted)
    )
    assert result.scores == [0.5, 0.5, 0.5]


async def test_the_default_cache_folder_is_read_when_scoring_not_at_import(
    scripted: ScriptedOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted.default = judge_by_quality
    monkeypatch.setenv("ART_AGENTS_RULER_CACHE", str(tmp_path / "set-after-import"))
    params = judge_params(scripted)
    del params["cache_dir"]  # the default
    await ruler_score_group(make_group([0.3, 0.6, 0.9]), **params)
    assert list((tmp_path / "set-after-import").rglob("*.json"))

"""A bad judge: malformed JSON, a missing id, a duplicate id, a score of 7, a timeout.

Each is re-asked with the problem named and then succeeds; when the attempts run out the error
lists every attempt, or the group is dropped with swallow_exceptions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from ruler_fixtures import judge_by_quality, judge_params, judge_with, make_group
from scripted_openai import ScriptedOpenAI

from art_agents.ruler import RulerError, ruler_score_group

Reply = Callable[[dict[str, Any]], str]


BAD_ANSWERS: dict[str, tuple[Reply, str]] = {
    "malformed json": (lambda body: '{"scores": [{"trajectory_id": "t1", "score": 0.', "the answer is not valid JSON"),
    "missing id": (judge_with(lambda entries: entries[:-1]), "no score for t3"),
    "duplicate id": (judge_with(lambda entries: [*entries, entries[0]]), "is scored more than once"),
    "score of 7": (judge_with(lambda entries: [(entries[0][0], 7.0), *entries[1:]]), "outside the range [0, 1]"),
    "unknown id": (judge_with(lambda entries: [*entries, ("t9", 0.5)]), "'t9', which is not one of the ids shown"),
}


@pytest.mark.parametrize("case", list(BAD_ANSWERS))
async def test_bad_answer_is_reasked_with_the_problem_named(scripted: ScriptedOpenAI, case: str) -> None:
    bad, problem = BAD_ANSWERS[case]
    scripted.replies = [bad]
    scripted.default = judge_by_quality
    scored = await ruler_score_group(make_group([0.1, 0.6, 0.3]), **judge_params(scripted))

    assert scored is not None and scored.rewards() == [0.1, 0.6, 0.3]
    first, second = scripted.requests
    assert second["messages"][: len(first["messages"])] == first["messages"]  # same prompt, then the exchange
    bad_answer, reask = second["messages"][len(first["messages"]) :]
    assert bad_answer["role"] == "assistant" and reask["role"] == "user"
    assert problem in reask["content"] and "t1, t2, t3" in reask["content"]
    calls = scored.metadata["ruler"]["calls"]
    assert [c["attempt"] for c in calls] == [1, 2] and problem in calls[0]["problem"] and calls[1]["problem"] is None
    assert scored.trajectories[0].metrics["ruler_judge_calls"] == 2


async def test_exhausted_attempts_raise_a_clear_error(scripted: ScriptedOpenAI) -> None:
    scripted.default = judge_with(lambda entries: [(i, s * 10) for i, s in entries])  # a 0-10 scale judge
    with pytest.raises(RulerError) as error:
        await ruler_score_group(make_group([0.1, 0.6, 0.3]), max_attempts=3, **judge_params(scripted))
    message = str(error.value)
    assert "'openai/judge' gave no usable answer in 3 attempts (last: " in message and "\n" not in message
    assert "trajectory t2 has score 6.0, outside the range [0, 1]" in message
    attempts = error.value.__cause__.__notes__  # every attempt, printed under the traceback
    assert [note.split(":")[0] for note in attempts] == ["attempt 1", "attempt 2", "attempt 3"]
    assert all("trajectory t2 has score 6.0, outside the range [0, 1]" in note for note in attempts)
    assert "swallow_exceptions=True" in message
    assert len(scripted.requests) == 3


async def test_exhausted_attempts_drop_the_group_when_swallowing(scripted: ScriptedOpenAI) -> None:
    scripted.default = judge_with(lambda entries: entries[:1])
    group = make_group([0.1, 0.6, 0.3])
    assert await ruler_score_group(group, swallow_exceptions=True, max_attempts=2, **judge_params(scripted)) is None
    assert len(scripted.requests) == 2
    assert group.rewards() == [10.0, 11.0, 12.0]


def slow(reply: Reply, seconds: float) -> Reply:
    def answer(body: dict[str, Any]) -> str:
        time.sleep(seconds)
        return reply(body)

    return answer


async def test_timeout_is_asked_again_with_the_same_prompt(scripted: ScriptedOpenAI) -> None:
    scripted.replies = [slow(judge_by_quality, 60)]  # the second, prompt answer has the timeout's 3 s, however busy
    scripted.default = judge_by_quality
    scored = await ruler_score_group(make_group([0.4, 0.2]), **judge_params(scripted, timeout=3))
    assert scored is not None and scored.rewards() == [0.4, 0.2]
    first, second = scripted.requests
    assert first["messages"] == second["messages"]
    calls = scored.metadata["ruler"]["calls"]
    assert "Timeout" in calls[0]["problem"] and calls[0]["prompt_tokens"] == 0 and calls[1]["problem"] is None


async def test_timeouts_exhausted_raise(scripted: ScriptedOpenAI) -> None:
    scripted.default = slow(judge_by_quality, 0.8)
    with pytest.raises(RulerError, match="could not be reached in 2 attempts") as error:
        await ruler_score_group(make_group([0.4, 0.2]), max_attempts=2, **judge_params(scripted, timeout=0.2))
    assert str(error.value).count("Timeout") >= 2 and "give it more time" in str(error.value)


async def test_an_unreachable_judge_names_the_endpoint_problem() -> None:
    with ScriptedOpenAI() as server:
        base = server.base_url  # closed once the block ends: connections are refused
    with pytest.raises(RulerError, match="Connection error"):
        await ruler_score_group(
            make_group([0.4, 0.2]),
            max_attempts=2,
            judge_model="openai/judge",
            api_base=base,
            api_key="k",
            timeout=2,
            cache_dir=None,
        )


async def test_a_judge_that_cannot_be_called_fails_at_once_with_the_fix_named() -> None:
    with pytest.raises(RulerError, match="cannot be called") as error:
        await ruler_score_group(make_group([0.4, 0.2]), judge_model="no-such-provider/judge", cache_dir=None)
    assert "Check the model string, api_base and api_key" in str(error.value)

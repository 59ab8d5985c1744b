"""Groups and scripted judges shared by the RULER tests.

The scripted judges read the trajectory ids and contents actually sent, so a test can check that
scores land on the right trajectory whatever order the prompt showed them in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from scripted_openai import ScriptedOpenAI

from art_agents import Trajectory, TrajectoryGroup

TRAJECTORY = re.compile(r'<trajectory id="(t\d+)">\n(.*?)\n</trajectory>', re.DOTALL)
QUALITY = re.compile(r"quality=([0-9.]+)")
SYSTEM = "You are a careful assistant that answers arithmetic questions. " * 5


def judge_params(server: ScriptedOpenAI, **extra: Any) -> dict[str, Any]:
    """`ruler_score_group` / `ruler` keywords for the scripted judge, with the cache off."""
    return {
        "judge_model": "openai/judge",
        "api_base": server.base_url,
        "api_key": "sk-test",
        "timeout": 60,  # a loopback judge answers at once; a busy machine must not turn that into a timeout
        "cache_dir": None,
        **extra,
    }


def conversation(task: str, quality: float, turns: int = 1) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    for turn in range(turns):
        messages.append({"role": "assistant", "content": f"step {turn} of an answer with quality={quality}"})
        if turn < turns - 1:
            messages.append({"role": "user", "content": "go on"})
    return messages


def make_group(qualities: list[float], task: str = "What is 2 + 2?") -> TrajectoryGroup:
    return TrajectoryGroup(
        Trajectory(messages=conversation(task, q), reward=10.0 + index) for index, q in enumerate(qualities)
    )


def shown(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(id, rendered remainder) for each trajectory in the judge request, in the order shown."""
    return TRAJECTORY.findall(body["messages"][1]["content"])


def answer(entries: list[tuple[str, float]]) -> str:
    return json.dumps({"scores": [{"trajectory_id": i, "explanation": f"judged {i}", "score": s} for i, s in entries]})


def judge_by_quality(body: dict[str, Any]) -> str:
    """A correct judge: each trajectory's score is the quality written in its own text."""
    return answer([(i, float(QUALITY.search(text).group(1))) for i, text in shown(body)])  # type: ignore[union-attr]


def judge_by_position(body: dict[str, Any]) -> str:
    """A judge that only reacts to position: first shown gets 1, last gets 0."""
    ids = [i for i, _ in shown(body)]
    return answer([(i, 1 - k / (len(ids) - 1)) for k, i in enumerate(ids)])


def judge_with(tamper: Callable[[list[tuple[str, float]]], list[tuple[str, float]]]) -> Callable[[dict[str, Any]], str]:
    """A correct judge whose answer is then spoiled (an id dropped, duplicated, a score of 7...)."""

    def reply(body: dict[str, Any]) -> str:
        entries = [(i, float(QUALITY.search(text).group(1))) for i, text in shown(body)]  # type: ignore[union-attr]
        return answer(tamper(entries))

    return reply

"""Trajectory and group validation, and the JSONL format."""

from __future__ import annotations

import json
import math

import pytest

from art_agents import Trajectory, TrajectoryGroup, read_groups, write_groups
from art_agents.trajectory import SCHEMA_VERSION, Turn


def traj(reward: float = 1.0) -> Trajectory:
    return Trajectory(
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        turns=[Turn(index=1, completion_id="c1", model="m@3", policy_step=3)],
        reward=reward,
        metrics={"len": 1},
    )


def test_nan_reward_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="reward must be a finite number"):
        traj(math.nan)
    t = traj()
    with pytest.raises(ValueError, match="reward must be a finite number"):
        t.reward = float("inf")


def test_unknown_role_names_the_message() -> None:
    with pytest.raises(ValueError, match=r"(?s)messages\[1\].*unknown message role 'human'"):
        Trajectory(messages=[{"role": "user", "content": "q"}, {"role": "human", "content": "x"}])


def test_turn_must_point_at_an_assistant_message() -> None:
    with pytest.raises(ValueError, match="not an assistant message"):
        Trajectory(messages=[{"role": "user", "content": "q"}], turns=[Turn(index=0)])


def test_finish_catches_bad_messages_appended_by_hand() -> None:
    t = traj()
    t.messages.append({"role": "robot", "content": "x"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown message role 'robot'"):
        t.finish()


def test_empty_group_cannot_be_trained_on() -> None:
    with pytest.raises(ValueError, match="no trajectories"):
        TrajectoryGroup([]).validate_for_training()


async def test_group_awaits_rollouts_and_keeps_exceptions() -> None:
    async def ok() -> Trajectory:
        return traj(0.5)

    async def boom() -> Trajectory:
        raise RuntimeError("no")

    group = await TrajectoryGroup([ok(), boom(), traj(1.0)])
    assert sorted(group.rewards()) == [0.5, 1.0]
    assert [(e.type, e.message) for e in group.exceptions] == [("RuntimeError", "no")]


def test_jsonl_round_trip(tmp_path) -> None:
    groups = [TrajectoryGroup([traj(0.0), traj(1.0)], metadata={"task": 1}), TrajectoryGroup([traj(0.25)])]
    path = write_groups(tmp_path / "g.jsonl", groups)
    again = read_groups(path)
    assert [g.model_dump() for g in again] == [g.model_dump() for g in groups]
    line = json.loads(path.read_text().splitlines()[0])
    assert line["schema_version"] == SCHEMA_VERSION
    assert line["trajectories"][0]["turns"][0]["completion_id"] == "c1"
    assert not list(tmp_path.glob(".*tmp"))


def test_jsonl_names_the_bad_line_and_a_newer_schema(tmp_path) -> None:
    path = tmp_path / "g.jsonl"
    good = TrajectoryGroup([traj()]).model_dump_json()
    path.write_text(good + "\n{not json}\n")
    with pytest.raises(ValueError, match=r"g.jsonl:2: not a valid trajectory group"):
        read_groups(path)
    newer = json.loads(good) | {"schema_version": SCHEMA_VERSION + 1}
    path.write_text(json.dumps(newer) + "\n")
    with pytest.raises(ValueError, match="upgrade art-agents"):
        read_groups(path)

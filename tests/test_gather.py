"""gather_trajectory_groups: failure budget both ways, after_each dropping and replacing groups."""

from __future__ import annotations

import asyncio

import pytest

from art_agents import (
    TooManyExceptions,
    Trajectory,
    TrajectoryGroup,
    gather_trajectories,
    gather_trajectory_groups,
    rollout,
)


async def attempt(reward: float, fail: bool = False) -> Trajectory:
    async with rollout(reward=reward) as traj:
        await asyncio.sleep(0.001)
        if fail:
            raise ValueError(f"bad {reward}")
        traj.reward = reward
    return traj


def groups(failures: int) -> list[TrajectoryGroup]:
    flags = [i < failures for i in range(8)]
    return [TrajectoryGroup(attempt(g * 4 + i, flags[g * 4 + i]) for i in range(4)) for g in range(2)]


async def test_exceptions_within_the_budget_are_kept_in_their_groups() -> None:
    finished = await gather_trajectory_groups(groups(2), max_exceptions=2, pbar_desc=None)
    assert [len(g.trajectories) for g in finished] == [2, 4]
    failed = finished[0].exceptions
    assert [e.message for e in failed] == ["bad 0", "bad 1"]
    assert all(e.trajectory is not None and e.trajectory.failed for e in failed)


async def test_exceptions_over_the_budget_raise() -> None:
    with pytest.raises(TooManyExceptions, match="3 rollouts raised, more than max_exceptions=2"):
        await gather_trajectory_groups(groups(3), max_exceptions=2, pbar_desc=None)


async def test_max_exceptions_as_a_fraction() -> None:
    finished = await gather_trajectory_groups(groups(2), max_exceptions=0.25, pbar_desc=None)  # 2 of 8 allowed
    assert sum(len(g.exceptions) for g in finished) == 2
    with pytest.raises(TooManyExceptions):
        await gather_trajectory_groups(groups(3), max_exceptions=0.25, pbar_desc=None)


async def test_default_budget_is_zero() -> None:
    with pytest.raises(TooManyExceptions):
        await gather_trajectory_groups(groups(1), pbar_desc=None)


async def test_after_each_can_drop_and_replace_groups() -> None:
    async def keep_good(group: TrajectoryGroup) -> TrajectoryGroup | None:
        if min(group.rewards()) == 0:
            return None
        return TrajectoryGroup(group.trajectories[:1], metadata={"replaced": True})

    finished = await gather_trajectory_groups(groups(0), after_each=keep_good, pbar_desc=None)
    assert len(finished) == 1
    assert finished[0].metadata == {"replaced": True} and finished[0].rewards() == [4.0]


async def test_gather_trajectories_keeps_order_and_failures_in_place() -> None:
    results = await gather_trajectories(
        [attempt(1), attempt(2, fail=True), attempt(3)], max_exceptions=1, pbar_desc=None
    )
    assert [getattr(r, "reward", None) for r in results] == [1, None, 3]
    assert results[1].message == "bad 2"


def test_bad_max_exceptions_is_refused() -> None:
    with pytest.raises(ValueError, match="max_exceptions"):
        asyncio.run(gather_trajectory_groups([], max_exceptions=-1, pbar_desc=None))


async def test_going_over_the_budget_cancels_the_other_rollouts() -> None:
    cancelled = asyncio.Event()

    async def waits_forever() -> Trajectory:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    stuck = TrajectoryGroup([waits_forever()])
    with pytest.raises(TooManyExceptions):
        await gather_trajectory_groups([groups(1)[0], stuck], pbar_desc=None)
    assert cancelled.is_set()

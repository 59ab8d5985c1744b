"""gather_trajectory_groups: failure budget both ways, after_each dropping and replacing groups,
errors every rollout would hit stopping the gather at once, timeouts around it."""

from __future__ import annotations

import asyncio

import pytest
from server_fixtures import free_port

from art_agents import (
    Model,
    SetupError,
    TooManyExceptions,
    TrainableModel,
    Trajectory,
    TrajectoryGroup,
    gather_trajectories,
    gather_trajectory_groups,
    rollout,
)

# a rollout coroutine left never awaited (a gather that stopped early must close it) fails the test
pytestmark = [
    pytest.mark.filterwarnings("error:coroutine .* was never awaited:RuntimeWarning"),
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]


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
    with pytest.raises(
        TooManyExceptions, match=r"3 of \d finished rollouts raised \(8 in all\), more than max_exceptions=2 allows"
    ):
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


async def waits_forever(cancelled: asyncio.Event) -> Trajectory:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        cancelled.set()
        raise
    raise AssertionError("unreachable")


async def test_going_over_the_budget_cancels_the_other_rollouts() -> None:
    cancelled = asyncio.Event()
    stuck = TrajectoryGroup([waits_forever(cancelled)])
    with pytest.raises(TooManyExceptions):
        await gather_trajectory_groups([*groups(1), stuck], pbar_desc=None)
    assert cancelled.is_set()


async def test_a_gather_cancelled_at_any_point_leaves_no_rollout_never_awaited() -> None:
    import gc

    for ticks in range(1, 6):  # cancel while and after the groups hand their rollouts to tasks (Ctrl-C, say)
        gather = asyncio.ensure_future(gather_trajectory_groups(groups(0), pbar_desc=None))
        for _ in range(ticks):
            await asyncio.sleep(0)
        gather.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gather
        gc.collect()  # a coroutine never awaited warns when it is collected: here, inside this test


async def test_the_message_counts_every_finished_failure_and_advises_by_cause() -> None:
    with pytest.raises(TooManyExceptions, match=r"^(\d+) of \1 finished rollouts raised \(8 in all\)") as raised:
        await gather_trajectory_groups(groups(8), max_exceptions=1, pbar_desc=None)
    assert str(raised.value).endswith("no rollout succeeded, so raising max_exceptions would not help: fix that error")
    with pytest.raises(TooManyExceptions, match=r"raise max_exceptions to tolerate occasional failures$"):
        await gather_trajectory_groups(groups(3), max_exceptions=1, pbar_desc=None)


async def ask(model: Model) -> Trajectory:
    async with rollout() as traj:
        client = model.openai_client()
        await client.chat.completions.create(
            model=model.get_inference_name(), messages=[{"role": "user", "content": "hi"}]
        )
    return traj


async def stops_at_once(rollouts: list[object]) -> BaseException:
    """Gather the rollouts beside one that never ends, with a budget they cannot exhaust; return what it raised.

    The minute's timeout only stands for "never": a gather that did not stop at once would wait for it."""
    cancelled = asyncio.Event()
    with pytest.raises(BaseException) as raised:
        async with asyncio.timeout(60):
            work = [TrajectoryGroup(rollouts[i : i + 4]) for i in range(0, len(rollouts), 4)]
            await gather_trajectory_groups([*work, TrajectoryGroup([waits_forever(cancelled)])], max_exceptions=100)
    assert not isinstance(raised.value, TimeoutError), "the gather went on as if the error were one rollout's"
    assert cancelled.is_set()
    assert "\n" not in str(raised.value)
    return raised.value


async def test_an_unregistered_model_stops_the_gather_naming_register() -> None:
    model = TrainableModel(name="agent", project="demo", base_model="unused")
    error = await stops_at_once([ask(model) for _ in range(16)])
    assert isinstance(error, SetupError)
    assert str(error) == "model 'agent' is not registered; call `await model.register(backend)` before its rollouts"


async def test_a_server_that_is_down_stops_the_gather_naming_its_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    error = await stops_at_once([ask(Model(name="m", inference_base_url=url)) for _ in range(8)])
    assert isinstance(error, SetupError)
    assert str(error).startswith(f"cannot connect to {url}/chat/completions (All connection attempts failed); start")


async def test_an_unknown_model_stops_the_gather_with_the_servers_answer(server_url: str) -> None:
    model = Model(name="nope", inference_base_url=f"{server_url}/v1")
    error = await stops_at_once([ask(model) for _ in range(8)])
    assert isinstance(error, SetupError)
    assert str(error).startswith(f"{server_url}/v1/chat/completions answered 404 (model 'nope' is not registered")
    assert str(error).endswith(
        "use a model name that server serves (GET /v1/models lists them) and a base URL ending in /v1"
    )


async def test_a_missing_dependency_stops_the_gather_and_a_lone_group() -> None:
    async def needs_an_extra() -> Trajectory:
        async with rollout() as traj:
            import art_agents_extra_that_is_not_installed  # noqa: F401
        return traj

    error = await stops_at_once([needs_an_extra() for _ in range(8)])
    assert isinstance(error, ModuleNotFoundError) and error.name == "art_agents_extra_that_is_not_installed"
    with pytest.raises(ModuleNotFoundError):
        await TrajectoryGroup([needs_an_extra(), needs_an_extra()])


async def test_timeouts_wrap_a_rollout_or_the_whole_gather() -> None:
    async def slow(seconds: float) -> Trajectory:
        async with rollout() as traj, asyncio.timeout(seconds):  # per rollout: counted as that rollout's failure
            await asyncio.sleep(1)
        return traj

    finished = await gather_trajectory_groups(
        [TrajectoryGroup([slow(0.01), attempt(1)])], max_exceptions=1, pbar_desc=None
    )
    assert [e.type for e in finished[0].exceptions] == ["TimeoutError"] and finished[0].rewards() == [1]
    cancelled = asyncio.Event()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):  # per gather: everything still running is cancelled
            await gather_trajectory_groups([TrajectoryGroup([waits_forever(cancelled)]), *groups(0)], pbar_desc=None)
    assert cancelled.is_set()

"""The pipelined loop: staleness stays within the bound whatever the rollouts' durations, draws train in
order, errors and cancellation leave nothing running (against a model object with just what the loop uses)."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from art_agents import TooManyExceptions, TrainConfig, TrainResult, Trajectory, TrajectoryGroup
from art_agents.loop.pipeline import PIPELINE_TIS_CAP, pipeline_config
from art_agents.loop.train import train_loop
from art_agents.trajectory import Turn


class SteppingModel:
    """Serves `step`; a train call takes `train_s`, advances when some group has a reward spread, and
    records how stale each group was (the step it trains at minus the oldest step a turn was sampled at)."""

    name = "pipeline-test"

    def __init__(self, train_s: list[float] | None = None) -> None:
        self.step = 0
        self.train_s = train_s or [0.0]
        self.calls: list[dict] = []
        self.training = False

    async def get_step(self) -> int:
        return self.step

    async def train(self, groups: list[TrajectoryGroup], config: TrainConfig | None = None, *, metrics=None):
        assert not self.training, "the loop must not run two train calls at once"
        self.training = True
        oldest = [min(t.policy_step for t in tr.turns) for g in groups for tr in g.trajectories]
        self.calls.append(
            {
                "step": self.step,
                "staleness": self.step - min(oldest),
                "scenarios": [g.metadata.get("scenario") for g in groups],
                "config": config,
                "metrics": dict(metrics or {}),
            }
        )
        await asyncio.sleep(self.train_s[len(self.calls) % len(self.train_s)])
        self.step += any(len(set(g.rewards())) > 1 for g in groups)
        self.training = False
        return TrainResult(step=self.step, config=config or TrainConfig())


def rollout_sleeping(durations: list[float], flat_every: int = 0):
    """A two-turn rollout: a turn sampled at the step served when it starts, a wait, a turn at the step then."""
    count, rng = 0, random.Random(0)

    async def attempt(model: SteppingModel, scenario: int) -> Trajectory:
        nonlocal count
        count += 1
        first = model.step
        await asyncio.sleep(durations[count % len(durations)])
        reward = 0.5 if flat_every and scenario % flat_every == 0 else rng.random()
        turns = [Turn(index=1, policy_step=first), Turn(index=3, policy_step=model.step)]
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}] * 2
        return Trajectory(messages=messages, turns=turns, reward=reward)

    return attempt


def scenarios(n: int = 7) -> list[int]:
    return list(range(n))


def tagging(attempt):
    """Groups remember their scenario (in `metadata`) so tests can compare draws."""

    async def tagged(model, scenario):
        trajectory = await attempt(model, scenario)
        trajectory.metadata["scenario"] = scenario
        return trajectory

    return tagged


async def group_scenario(group: TrajectoryGroup) -> TrajectoryGroup:
    group.metadata["scenario"] = group.trajectories[0].metadata["scenario"] if group.trajectories else None
    return group


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ahead=st.integers(0, 3),
    durations=st.lists(st.floats(0, 0.004), min_size=1, max_size=9),
    train_s=st.lists(st.floats(0, 0.004), min_size=1, max_size=4),
    flat_every=st.sampled_from([0, 2, 3]),
)
def test_staleness_never_exceeds_the_bound(ahead, durations, train_s, flat_every) -> None:
    model = SteppingModel(train_s)
    records = asyncio.run(
        train_loop(
            model,
            tagging(rollout_sleeping(durations, flat_every)),
            scenarios(),
            steps=4,
            groups_per_step=2,
            rollouts_per_group=2,
            after_each=group_scenario,
            pipeline=True,
            max_steps_off_policy=ahead,
        )
    )
    assert model.step == 4
    assert all(call["staleness"] <= ahead for call in model.calls), [c["staleness"] for c in model.calls]
    draws = [record.metrics["pipeline/draw"] for record in records]
    assert draws == sorted(draws) and len(set(draws)) == len(draws)  # in order, none twice
    assert all(record.metrics["pipeline/stale_groups_dropped"] == 0 for record in records)  # paced, not discarded
    assert all(record.metrics["pipeline/staleness"] <= ahead for record in records)


async def test_the_pipeline_draws_what_the_synchronous_loop_draws() -> None:
    """Same seed: the same scenarios in the same order, whatever the bound (and the synchronous loop as before)."""
    drawn = []
    for pipeline, ahead in [(False, 0), (True, 0), (True, 2)]:
        model = SteppingModel()
        await train_loop(
            model,
            tagging(rollout_sleeping([0.001, 0.003], flat_every=3)),
            scenarios(),
            steps=3,
            groups_per_step=2,
            rollouts_per_group=2,
            seed=11,
            after_each=group_scenario,
            pipeline=pipeline,
            max_steps_off_policy=ahead,
        )
        drawn.append([call["scenarios"] for call in model.calls])
    assert drawn[0] == drawn[1] == drawn[2]
    order = list(range(7))
    random.Random(11).shuffle(order)
    assert drawn[0][0] == order[:2]  # the synchronous loop's shuffle, unchanged


async def rollouts_started_while_training(ahead: int) -> list[bool]:
    model, sleeping, started_while_training = SteppingModel(train_s=[0.05]), rollout_sleeping([0.01]), []

    async def attempt(model: SteppingModel, scenario: int) -> Trajectory:
        started_while_training.append(model.training)
        return await sleeping(model, scenario)

    await train_loop(
        model, attempt, scenarios(), steps=3, groups_per_step=1, rollouts_per_group=2,
        pipeline=True, max_steps_off_policy=ahead,
    )  # fmt: skip
    return started_while_training


async def test_rollouts_go_on_while_a_step_trains() -> None:
    """With a bound of 1 the next draw's rollouts run during the train call; with 0 they wait for it."""
    assert any(await rollouts_started_while_training(1))
    assert not any(await rollouts_started_while_training(0))


async def test_the_pipeline_sets_staleness_and_importance_sampling_and_sends_its_figures() -> None:
    model = SteppingModel()
    records = await train_loop(
        model, rollout_sleeping([0.001]), scenarios(), steps=2, groups_per_step=1, rollouts_per_group=2,
        pipeline=True, max_steps_off_policy=2,
    )  # fmt: skip
    config = model.calls[0]["config"]
    assert config.max_staleness == 2 and config.tis_cap == PIPELINE_TIS_CAP
    sent = model.calls[0]["metrics"]
    for name in ("trainer_wait_s", "rollout_wait_s", "rollout_s", "rollouts_per_s", "trained_rollouts_per_s"):
        assert sent[f"pipeline/{name}"] >= 0
    assert records[0].metrics["pipeline/draw"] == 0.0
    assert pipeline_config(TrainConfig(tis_cap=None), 1).tis_cap is None  # an explicit choice is kept
    with pytest.raises(ValueError, match="max_staleness=0 would refuse turns that max_steps_off_policy=1"):
        pipeline_config(TrainConfig(max_staleness=0), 1)


def running_tasks() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()}


@pytest.fixture
async def leftover_tasks():
    """Tasks started during the test and still running (the event loop is shared with other tests)."""
    before = running_tasks()
    return lambda: running_tasks() - before


async def test_a_failing_draw_stops_the_pipeline_and_leaves_nothing_running(leftover_tasks) -> None:
    sleeping = rollout_sleeping([0.02])

    async def attempt(model: SteppingModel, scenario: int) -> Trajectory:
        if scenario == 4:
            raise RuntimeError("tool down")
        return await sleeping(model, scenario)

    with pytest.raises(TooManyExceptions, match="tool down"):
        await train_loop(
            model := SteppingModel(), attempt, scenarios(), steps=5, groups_per_step=1, rollouts_per_group=2,
            max_exceptions=0, pipeline=True, max_steps_off_policy=2,
        )  # fmt: skip
    assert leftover_tasks() == set()
    assert model.step < 5


async def test_a_scenario_source_that_raises_reaches_the_caller(leftover_tasks) -> None:
    class Broken:
        def pick(self, draw: int, count: int) -> list[int]:
            if draw == 1:
                raise LookupError("pool exhausted")
            return [draw] * count

    with pytest.raises(LookupError, match="pool exhausted"):
        await train_loop(
            SteppingModel(), rollout_sleeping([0.001]), Broken(), steps=3, groups_per_step=1, rollouts_per_group=2,
            pipeline=True,
        )  # fmt: skip
    assert leftover_tasks() == set()


async def test_cancelling_the_loop_mid_step_cancels_every_rollout(leftover_tasks) -> None:
    """Ctrl-C: the loop's task is cancelled while a step trains and later draws roll out."""
    model = SteppingModel(train_s=[0.2])
    run = train_loop(
        model, rollout_sleeping([0.05]), scenarios(), steps=5, groups_per_step=2, rollouts_per_group=2,
        pipeline=True, max_steps_off_policy=2,
    )  # fmt: skip
    loop = asyncio.create_task(run)
    while not model.training:
        await asyncio.sleep(0.005)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    assert leftover_tasks() == set()


async def test_groups_made_stale_by_another_client_are_dropped_and_counted() -> None:
    """Another client trains the same model 3 steps mid-draw: what is now too stale is dropped, not trained."""
    model, sleeping, jumped = SteppingModel(), rollout_sleeping([0.01]), []

    async def attempt(model: SteppingModel, scenario: int) -> Trajectory:
        trajectory = await sleeping(model, scenario)
        if not jumped:
            jumped.append(True)
            model.step += 3
        return trajectory

    records = await train_loop(
        model, attempt, scenarios(), steps=5, groups_per_step=2, rollouts_per_group=2,
        pipeline=True, max_steps_off_policy=1,
    )  # fmt: skip
    assert model.step == 5 and len(records) == 2
    assert records[-1].metrics["pipeline/stale_groups_dropped"] == 4  # both draws begun at step 0
    assert all(call["staleness"] <= 1 for call in model.calls)


async def test_a_judge_that_is_down_stops_the_pipeline_naming_it(leftover_tasks) -> None:
    """`after_each` (RULER, say) raising while later draws roll out: the error surfaces and nothing is left running."""
    calls = []

    async def judge(group: TrajectoryGroup) -> TrajectoryGroup:
        calls.append(group)
        if len(calls) == 3:
            raise ConnectionError("judge at http://127.0.0.1:9 refused the connection")
        return group

    model = SteppingModel(train_s=[0.02])
    with pytest.raises(ConnectionError, match="judge at"):
        await train_loop(
            model, rollout_sleeping([0.01]), scenarios(), steps=5, groups_per_step=1, rollouts_per_group=2,
            after_each=judge, pipeline=True, max_steps_off_policy=1,
        )  # fmt: skip
    assert leftover_tasks() == set()
    assert model.step == 2  # the draws judged before it trained

"""Off-policy guidance (`autorl/guidance.py`): a group the student failed takes the teacher's rollout, which the
server then trains as the student's own turns; a solved group, or a teacher that does no better, changes nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from mcp_fixtures import free_port
from scripted_openai import ScriptedOpenAI
from server_fixtures import start_server

from art_agents import Trajectory, TrajectoryGroup
from art_agents.autorl.guidance import Guide
from art_agents.autorl.scenarios import Scenario
from art_agents.autorl.scoring import GroupScorer
from art_agents.backends.remote import RemoteBackend
from art_agents.capture import rollout
from art_agents.model import Model, TrainableModel

TASK = Scenario(id="t0", split="train", task="What is six times seven?", difficulty=1)
RIGHT = "The answer is 42."


async def attempt(model: Model, scenario: Scenario) -> Trajectory:
    client = model.openai_client()
    async with rollout(scenario_id=scenario.id) as trajectory:
        await client.chat.completions.create(
            model=model.served_name, messages=[{"role": "user", "content": scenario.task}], max_tokens=6
        )
    await client.close()
    return trajectory


def says_42(scenario: Scenario, trajectory: Trajectory) -> float:
    return 1.0 if "42" in str(trajectory.messages[-1].content) else 0.0


async def test_a_failed_group_trains_on_the_teachers_rollout_as_the_students_own(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    with ScriptedOpenAI() as endpoint, start_server(tmp_path / "art") as url:
        endpoint.default = RIGHT
        backend = RemoteBackend(url)
        model = TrainableModel(name="student", project="p", base_model=str(tiny_model_path))
        await model.register(backend)
        teacher = Model(name="teacher", inference_base_url=endpoint.base_url, inference_api_key="k")
        guide = Guide(teacher, attempt, GroupScorer({TASK.id: TASK}, reward=says_42), below=1.0)

        students = [await attempt(model, TASK) for _ in range(3)]
        guided = await guide(TrajectoryGroup(students))
        assert guided is not None and guide.guided == 1 and len(endpoint.requests) == 1
        demo = next(t for t in guided.trajectories if t.metadata.get("teacher"))
        assert demo.reward == 1.0 and demo.messages[-1].content == RIGHT
        assert [(turn.model, turn.completion_id) for turn in demo.turns] == [(None, None)]  # the student's to tokenize
        assert sorted(t.reward for t in guided.trajectories) == [0.0, 0.0, 1.0]
        assert all(t.reward == 0.0 and not t.metadata.get("teacher") for t in students)  # the rolled group is kept

        result = await model.train([guided], progress=False)
        assert result.step == 1 and result.metrics["turns_retokenized"] == 1 and result.metrics["turns_foreign"] == 0
        assert result.metrics["turns_from_store"] == 2

        solved = TrajectoryGroup([await attempt(model, TASK), await attempt(teacher, TASK)])
        assert await guide(solved) is solved and len(endpoint.requests) == 2  # its best reached 1: no teacher asked
        await backend.close()


async def test_a_teacher_that_does_no_better_or_cannot_be_reached_leaves_the_group_as_rolled(
    tiny_model_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with ScriptedOpenAI() as endpoint, start_server(tmp_path / "art") as url:
        endpoint.default = "I do not know."
        backend = RemoteBackend(url)
        model = TrainableModel(name="student", project="p", base_model=str(tiny_model_path))
        await model.register(backend)
        teacher = Model(name="teacher", inference_base_url=endpoint.base_url, inference_api_key="k")
        guide = Guide(teacher, attempt, GroupScorer({TASK.id: TASK}, reward=says_42), below=1.0)
        group = TrajectoryGroup([await attempt(model, TASK) for _ in range(2)])
        kept = await guide(group)
        assert kept is group and guide.guided == 0 and len(endpoint.requests) == 1
        assert not any(t.metadata.get("teacher") for t in kept.trajectories)

        gone = Model(name="gone", inference_base_url=f"http://127.0.0.1:{free_port()}/v1", inference_api_key="k")
        unreachable = Guide(gone, attempt, GroupScorer({TASK.id: TASK}, reward=says_42), below=1.0)
        with caplog.at_level(logging.WARNING, logger="art_agents.autorl.guidance"):
            assert await unreachable(group) is group and unreachable.guided == 0
        assert "the teacher 'gone' failed on task t0, so its group is not guided" in caplog.text
        await backend.close()

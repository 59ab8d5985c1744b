"""RULER's explanations as self-distillation hints (`--ruler-hints`), end to end: real rollouts of the tiny model on
a served model, a scripted judge over LiteLLM, the hints over HTTP to the trainer; and the checkpoints a step names
(`reference_step`, `teacher`) refused by name when the model has none."""

from __future__ import annotations

from pathlib import Path

import pytest
from ruler_fixtures import judge_by_position
from scripted_openai import ScriptedOpenAI
from server_fixtures import start_server
from test_guidance import TASK, attempt

from art_agents import TrainConfig, TrajectoryGroup
from art_agents.autorl.from_description import AutoRLConfig
from art_agents.autorl.scoring import GroupScorer
from art_agents.backends.remote import RemoteBackend
from art_agents.errors import ArtError
from art_agents.model import TrainableModel


async def test_the_judges_explanations_become_hints_that_train(tiny_model_path: Path, tmp_path: Path) -> None:
    with ScriptedOpenAI() as judge, start_server(tmp_path / "art") as url:
        judge.default = judge_by_position
        params = {"api_base": judge.base_url, "api_key": "sk-test", "cache_dir": None, "timeout": 60}
        scorer = GroupScorer({TASK.id: TASK}, judge_model="openai/judge", judge_params=params, hints=True)
        backend = RemoteBackend(url)
        model = TrainableModel(name="student", project="p", base_model=str(tiny_model_path))
        await model.register(backend)
        group = await scorer(TrajectoryGroup([await attempt(model, TASK) for _ in range(3)]))
        assert group is not None
        hints = [t.hint or "" for t in group.trajectories]
        assert all(h.startswith("A reviewer judged an earlier attempt") for h in hints)
        assert {h.rsplit(": ", 1)[1] for h in hints} == {f"judged t{i}" for i in (1, 2, 3)}  # each its own words

        result = await model.train([group], TrainConfig(self_distill=1.0), progress=False)
        assert result.step == 1 and result.metrics["trajectories_hinted"] == 3
        assert result.metrics["hinted_fraction"] == 1.0 and "self_distill_kl" in result.metrics

        with pytest.raises(ArtError, match=r"step 4 \(reference_step or teacher\) has no checkpoint: student is at"):
            await model.train([group], TrainConfig(self_distill=1.0, teacher=4, max_staleness=1), progress=False)
        await backend.close()


def test_ruler_hints_turn_self_distillation_on_and_need_a_judge() -> None:
    config = AutoRLConfig(task="Answer arithmetic questions.", base_model="m", judge_model="j", ruler_hints=True)
    assert config.train.self_distill == 1.0
    kept = AutoRLConfig(
        task="Answer arithmetic questions.", base_model="m", judge_model="j", ruler_hints=True,
        train=TrainConfig(self_distill=0.3),
    )  # fmt: skip
    assert kept.train.self_distill == 0.3
    with pytest.raises(ValueError, match=r"ruler_hints uses RULER's explanations; give a judge \(--judge-model\)"):
        AutoRLConfig(task="Answer arithmetic questions.", base_model="m", ruler_hints=True)

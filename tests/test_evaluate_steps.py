"""`art.evaluate` on steps of ours: the tiny model before and after an SFT step that teaches it a reply, beside a
scripted endpoint standing for a frontier model; files under the model's own folder."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from scripted_openai import ScriptedOpenAI

import art_agents as art
from art_agents.local import LocalBackend
from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG

QUESTION, REPLY = "What is the capital of Zorbia?", "Zorbia's capital is Quuxtown."
SCENARIOS = [{"id": f"s{i}", "question": QUESTION} for i in range(4)]


async def rollout(model: art.Model, scenario: dict[str, Any]) -> art.Trajectory:
    client = model.openai_client()
    async with art.rollout() as trajectory:
        reply = await client.chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": scenario["question"]}], max_tokens=40
        )
        trajectory.reward = float(REPLY in (reply.choices[0].message.content or ""))
    await client.close()
    return trajectory


@pytest.fixture
async def backend(tmp_path: Path) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    yield backend
    await backend.close()


async def test_a_trained_step_beats_its_base_and_is_saved_in_its_folder(
    backend: LocalBackend, tiny_model_path: Path
) -> None:
    model = art.TrainableModel(
        name="zorbia", project="eval", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG, report_to=[]
    )
    await model.register(backend)
    demo = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": QUESTION}, {"role": "assistant", "content": REPLY}]
    )
    await model.train_sft([demo], art.TrainSFTConfig(learning_rate=1e-2, epochs=100), progress=False)
    with ScriptedOpenAI(model_suffix="") as frontier:
        frontier.default = lambda body: REPLY if body["messages"][-1]["content"] == QUESTION else "?"
        result = await art.evaluate(
            rollout,
            SCENARIOS,
            [model, "zorbia@0", art.Model(name="frontier", inference_base_url=frontier.base_url)],
            decoding="greedy",
            pbar_desc=None,
        )
    trained, base, _ = result.summary.models
    assert (trained.model, trained.step, trained.mean_reward) == ("zorbia@1", 1, 1.0)
    assert (base.model, base.step, base.mean_reward) == ("zorbia@0", 0, 0.0)
    turns = [t.turns[0] for t in result.trajectories("zorbia@0")]
    assert {t.model for t in turns} == {"zorbia@0"}  # the rollout asked for "zorbia"; the step asked for was served
    versus_base = next(c for c in result.summary.comparisons if c.baseline == "zorbia@1" and c.model == "zorbia@0")
    assert (versus_base.mean_difference, versus_base.win_rate) == (-1.0, 0.0)
    folder = backend.path / "eval" / "models" / "zorbia" / "eval" / "heldout"
    assert result.folder == folder and json.loads((folder / "summary.json").read_text())["scenarios"] == 4
    assert sorted(p.name for p in folder.glob("*.jsonl")) == ["frontier.jsonl", "zorbia@0.jsonl", "zorbia@1.jsonl"]


async def test_train_loop_evaluates_every_n_steps(backend: LocalBackend, tiny_model_path: Path) -> None:
    model = art.TrainableModel(
        name="looped", project="eval", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG, report_to=[]
    )
    await model.register(backend)

    async def letters(model: art.Model, scenario: dict[str, Any]) -> art.Trajectory:
        client = model.openai_client()
        async with art.rollout() as trajectory:
            reply = await client.chat.completions.create(
                model=model.name, messages=[{"role": "user", "content": scenario["question"]}], max_tokens=8
            )
            text = reply.choices[0].message.content or ""
            trajectory.reward = text.count("a") / max(len(text), 1) + len(text) / 100
        await client.close()
        return trajectory

    train = [{"question": f"Write {i} words."} for i in range(4)]
    records = await art.train_loop(
        model, letters, train, steps=2, groups_per_step=1, rollouts_per_group=3, eval_every=2,
        eval_scenarios=SCENARIOS[:2],
    )  # fmt: skip
    assert [r.step for r in records] == [1, 2] and "eval/reward" in records[1].metrics
    summary = json.loads(
        (backend.path / "eval" / "models" / "looped" / "eval" / "heldout" / "summary.json").read_text()
    )
    assert [m["model"] for m in summary["models"]] == ["looped@0", "looped@2"]  # the start and every 2nd step
    assert summary["comparisons"][0]["paired"] == 2


async def test_every_bad_model_is_named_in_one_setup_error(backend: LocalBackend, tiny_model_path: Path) -> None:
    from art_agents.backends.ports import free_port
    from art_agents.errors import SetupError

    model = art.TrainableModel(
        name="agent", project="eval", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG, report_to=[]
    )
    await model.register(backend)
    ghost = f"ghost@http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(SetupError) as caught:
        await art.evaluate(rollout, SCENARIOS, [model, "agent@999", "nosuch", ghost], pbar_desc=None)
    message = str(caught.value)
    assert "\n" not in message
    assert "'agent@999': agent has no checkpoint 999" in message  # resolved, then checked
    assert "'nosuch' is not a model evaluate knows" in message  # cannot be resolved
    assert f"{ghost!r} is unreachable" in message  # resolved, then checked
    assert not (backend.path / "eval" / "models" / "agent" / "eval").exists()  # nothing ran, nothing saved

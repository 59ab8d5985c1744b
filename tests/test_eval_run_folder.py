"""`art-agents eval RUN_FOLDER`: an AutoRL run's held-out inputs, its own rollout and judge, for any models; and one
error line for a folder that is neither a job file nor a run folder."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

from autorl_fixtures import TASK, ScriptedAutoRL
from ruler_fixtures import answer, shown
from scripted_openai import ScriptedOpenAI
from typer.testing import CliRunner

from art_agents.cli.main import app, load_parts


def generator_and_judge() -> Any:
    """The scripted generator, and a RULER judge that scores a French answer 1 and any other 0."""
    generator = ScriptedAutoRL()

    def reply(body: dict[str, Any]) -> str:
        if body["messages"][0]["content"].startswith(("You prepare", "You write inputs")):
            return generator(body)
        return answer([(i, float("bonjour" in text)) for i, text in shown(body)])

    return reply


def test_a_run_folders_heldout_inputs_compare_the_models(tmp_path: Path, monkeypatch: Any) -> None:
    from art_agents.autorl.from_description import AutoRLConfig, prepare_run

    monkeypatch.setenv("ART_AGENTS_RULER_CACHE", str(tmp_path / "ruler-cache"))
    run = tmp_path / "run"
    with (
        ScriptedOpenAI(model_suffix="") as scripted,
        ScriptedOpenAI(model_suffix="") as french,
        ScriptedOpenAI(model_suffix="") as english,
    ):
        scripted.default, french.default, english.default = generator_and_judge(), "bonjour", "hello"
        params = {"api_base": scripted.base_url, "api_key": "sk-test"}
        config = AutoRLConfig(
            task=TASK, base_model="unused", judge_model="openai/judge", judge_params=params, inputs=2, eval_inputs=3,
            out=run,
        )  # fmt: skip
        asyncio.run(prepare_run(config, echo=lambda _: None))  # the folder `art-agents autorl --dry-run` writes
        load_parts()
        models = f"en@{english.base_url},fr@{french.base_url}"
        judging = ["--judge-model", "openai/judge", "--judge-api-base", scripted.base_url, "--judge-api-key", "sk-test"]
        result = CliRunner().invoke(app, ["eval", str(run), "--models", models, *judging, "--out", str(tmp_path)])
        held_out = [json.loads(line)["input"] for line in (run / "eval.jsonl").read_text().splitlines()]
        asked = {r["messages"][-1]["content"] for r in french.requests}
        system = {r["messages"][0]["content"] for r in french.requests}
    assert result.exit_code == 0, result.output
    assert asked == set(held_out) and system == {(run / "system_prompt.md").read_text().strip()}
    summary = json.loads((tmp_path / "eval" / "heldout" / "summary.json").read_text())
    assert [(m["scenarios"], m["mean_reward"]) for m in summary["models"]] == [(3, 0.0), (3, 1.0)]
    pair = summary["comparisons"][0]
    assert (pair["mean_difference"], pair["wins"], pair["paired"]) == (1.0, 3, 3)
    assert f"fr@{french.base_url}" in result.output and "evaluation heldout: pairs" in result.output


def test_a_folder_that_is_no_run_gets_one_error_line(tmp_path: Path) -> None:
    load_parts()
    result = CliRunner().invoke(app, ["eval", str(tmp_path), "--models", "x@http://127.0.0.1:9/v1"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path} is neither a job file nor")
    assert "--scenarios HELDOUT.jsonl" in lines[0] and "art-agents autorl" in lines[0]


def test_the_quickstarts_model_folder_compares_its_base_with_its_trained_step(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    from art_agents.evaluation.files import read_runs
    from art_agents.server.ops.quickstart import HELDOUT_PROMPTS, PROMPTS, model_folder, toy_reward, train_quickstart

    art_path = tmp_path / ".art"
    shutil.copytree(tiny_model_path, art_path / "quickstart" / "tiny-model")  # the model it would build
    asyncio.run(train_quickstart(2, art_path))
    load_parts()
    folder = model_folder(art_path)
    result = CliRunner().invoke(app, ["eval", str(folder)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.split()[:3] == ["quickstart@2", "quickstart@0", str(len(HELDOUT_PROMPTS))] for line in lines)
    saved = folder / "eval" / "heldout"
    summary = json.loads((saved / "summary.json").read_text())
    assert [(m["model"], m["scenarios"]) for m in summary["models"]] == [("quickstart@0", 8), ("quickstart@2", 8)]
    for step in (0, 2):
        trajectories = [t for run in read_runs(saved / f"quickstart@{step}.jsonl").values() for t in run.trajectories]
        asked = {t.messages[0].content for t in trajectories}
        assert asked == set(HELDOUT_PROMPTS) and not asked & set(PROMPTS)  # held out: never trained on
        assert all(t.reward == toy_reward(t.messages[-1].content or "") for t in trajectories)  # its own reward
        assert {t.turns[0].model for t in trajectories} == {f"quickstart@{step}"}  # the step asked for was served

    judged = CliRunner().invoke(app, ["eval", str(folder), "--judge-model", "openai/judge"])
    assert judged.exit_code == 1 and "the quickstart scores with its own reward" in judged.output

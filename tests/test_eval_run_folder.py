"""`art-agents eval RUN_FOLDER`: an AutoRL run's held-out inputs, its own rollout and recorded judge, for any models,
as the run's own evaluation gives them; and one error line for a folder that is neither a job file nor a run
folder, or a run folder that records no judge."""

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
from art_agents.evaluation.files import EvalSummary
from art_agents.evaluation.tables import eval_model_rows, eval_pair_rows


def generator_and_judge() -> Any:
    """The scripted generator; a RULER judge that scores a French answer 1 and any other 0; a pairwise judge that
    prefers the French answer."""
    generator = ScriptedAutoRL()

    def reply(body: dict[str, Any]) -> str:
        system = body["messages"][0]["content"]
        if system.startswith(("You prepare", "You write inputs")):
            return generator(body)
        if system.startswith("You compare two answers"):
            first = body["messages"][1]["content"].split("Answer 1:\n")[1].split("\n")[0]
            return json.dumps({"explanation": "French", "better": "1" if "bonjour" in first else "2"})
        return answer([(i, float("bonjour" in text)) for i, text in shown(body)])

    return reply


def comparable(summary: EvalSummary) -> tuple[list[list[str]], list[list[str]]]:
    """An evaluation's table rows, less the one column two runs of it cannot share: the seconds a rollout took."""
    latency = eval_model_rows(summary)[0].index("latency\ns")
    models = [row[:latency] + row[latency + 1 :] for row in eval_model_rows(summary)[1]]
    return models, eval_pair_rows(summary)[1]


def test_eval_of_a_run_folder_needs_no_flag_and_gives_the_runs_own_table(tmp_path: Path, monkeypatch: Any) -> None:
    from art_agents.autorl.from_description import AutoRLConfig, _Run, prepare_run

    monkeypatch.setenv("ART_AGENTS_RULER_CACHE", str(tmp_path / "ruler-cache"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # the judge's key is never recorded: it comes from here
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
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
        folder, data = asyncio.run(prepare_run(config, echo=lambda _: None))  # what `autorl --dry-run` writes
        models = [f"en@{english.base_url}", f"fr@{french.base_url}"]
        own = asyncio.run(_Run(config, folder, data, print).held_out.compare(models))  # the run's own evaluation
        load_parts()
        result = CliRunner().invoke(app, ["eval", str(run), "--models", ",".join(models), "--out", str(elsewhere)])
        held_out = [json.loads(line)["input"] for line in (run / "eval.jsonl").read_text().splitlines()]
        asked = {r["messages"][-1]["content"] for r in french.requests}
        system = {r["messages"][0]["content"] for r in french.requests}
        settings = (run / "eval_settings.json").read_text()
        (run / "eval_settings.json").unlink()  # a folder of an older run: its judge must be given
        older = CliRunner().invoke(app, ["eval", str(run), "--models", models[0], "--out", str(tmp_path / "older")])
    assert result.exit_code == 0, result.output
    assert asked == set(held_out) and system == {(run / "system_prompt.md").read_text().strip()}
    assert {r["temperature"] for r in french.requests} == {0.0}  # the run's evaluation temperature, recorded
    summary = EvalSummary.model_validate_json((elsewhere / "eval" / "heldout" / "summary.json").read_text())
    assert [(m.scenarios, m.mean_reward) for m in summary.models] == [(3, 0.0), (3, 1.0)]
    pair = summary.comparisons[0]
    assert (pair.mean_difference, pair.wins, pair.paired) == (1.0, 3, 3)
    assert pair.judged is not None and (pair.judged.wins, pair.judged.win_rate) == (3, 1.0)  # judged side by side
    assert comparable(summary) == comparable(own.summary)  # `eval RUN_FOLDER` reproduces the run's own table
    assert f"fr@{french.base_url}" in result.output and "evaluation heldout: pairs" in result.output
    assert eval_pair_rows(summary)[0][-1].startswith("judged") and "sk-test" not in settings
    assert older.exit_code == 1 and older.output.count("\n") == 1 and "give --judge-model" in older.output


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

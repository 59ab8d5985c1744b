"""An evaluation as `art-agents report` shows it (tables, a bar chart with intervals, evaluated steps on the training
curve) and through ART's `art.utils.benchmarking` names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scripted_openai import ScriptedOpenAI
from test_evaluate import SCENARIOS, answering, rollout

import art_agents as art
from art_agents.evaluation.charts import draw_evaluated_steps, figure
from art_agents.evaluation.files import EvalSummary, ModelSummary, ScenarioRun
from art_agents.report.command import _eval_tables
from art_agents.report.page import write_report
from art_agents.utils import benchmarking

pytest.importorskip("matplotlib")


@pytest.fixture
async def model_dir(tmp_path: Path) -> Path:
    """A model folder (as the server writes it) with one evaluation of two scripted models in it."""
    folder = tmp_path / ".art" / "proj" / "models" / "agent"
    folder.mkdir(parents=True)
    (folder / "model.json").write_text(json.dumps({"name": "agent", "project": "proj"}))
    (folder / "history.jsonl").write_text(json.dumps({"step": 1, "metrics": {"reward_mean": 0.4}}) + "\n")
    with ScriptedOpenAI(model_suffix="") as good, ScriptedOpenAI(model_suffix="") as weak:
        good.default, weak.default = answering({0, 1, 2, 3, 4}), answering({0})
        models = [
            art.Model(name="weak", inference_base_url=weak.base_url),
            art.Model(name="good", inference_base_url=good.base_url),
        ]
        await art.evaluate(rollout, SCENARIOS, models, out=folder, pbar_desc=None)
    return folder


def test_the_report_shows_the_comparison(model_dir: Path) -> None:
    page = write_report(model_dir).read_text()
    assert 'id="chart-eval-heldout"' in page and 'src="data:image/png;base64,' in page
    assert '<td class="l">good</td><td class="l">weak</td><td class="">6</td>' in page  # the pair: 6 paired scenarios
    assert "unknown" in page  # no price for these endpoints
    models, pairs = _eval_tables(model_dir)
    headers = [c.header for c in models.columns][:4]
    assert headers == ["model", "scenarios\nrun/failed", "rollouts\nfailed", "mean\nreward"]
    assert list(pairs.columns[2].cells) == ["6"] and list(pairs.columns[6].cells) == ["4/0/2"]


def test_evaluated_steps_are_marked_on_the_training_curve() -> None:
    def at(step: int, mean: float) -> ModelSummary:
        return ModelSummary(model=f"agent@{step}", file="x", step=step, scenarios=4, failed_scenarios=0,
                            failed_rollouts=0, mean_reward=mean, ci_low=mean - 0.1, ci_high=mean + 0.1)  # fmt: skip

    summary = EvalSummary(name="heldout", scenarios=4, rollouts_per_scenario=1, decoding="greedy",
                          models=[at(0, 0.2), at(3, 0.6)], comparisons=[])  # fmt: skip
    _, ax = figure()
    assert draw_evaluated_steps(ax, [summary], "agent")
    (markers, *_), label = ax.containers[0], ax.get_legend_handles_labels()[1]
    assert list(markers.get_xdata()) == [0, 3] and list(markers.get_ydata()) == [0.2, 0.6] and label == ["eval heldout"]
    assert not draw_evaluated_steps(figure()[1], [summary], "other-model")


def test_model_names_show_whole_in_the_tables_at_80_columns(tmp_path: Path) -> None:
    from rich.console import Console

    from art_agents.evaluation.files import write_summary
    from art_agents.evaluation.run import summarize
    from art_agents.evaluation.targets import EvalTarget

    labels = ["quickstart@0", "quickstart@20", "fr@http://127.0.0.1:43215/v1"]
    targets = [EvalTarget(label, art.Model(name=label), "local") for label in labels]
    runs = {label: [ScenarioRun(scenario_id=f"s{i}", index=i, rewards=[0.1 * i * n]) for i in range(4)]
            for n, label in enumerate(labels)}  # fmt: skip
    write_summary(tmp_path / "eval" / "heldout", summarize("heldout", targets, runs, 4, 1, "greedy"))
    console = Console(width=80, record=True)
    for table in _eval_tables(tmp_path):
        console.print(table)
    lines = console.export_text().splitlines()
    assert "…" not in "\n".join(lines) and max(len(line) for line in lines) <= 80
    for label in labels:
        assert any(line.startswith(f"{label} ") for line in lines), label  # each model's row, its name whole
    pair = next(line.split() for line in lines if line.split()[:2] == ["quickstart@20", "quickstart@0"])
    assert pair[2:4] == ["4", "0.15"]  # paired scenarios, and the later model minus the one before it


async def test_art_benchmarking_names_read_and_chart_an_evaluation(model_dir: Path, tmp_path: Path) -> None:
    rows = await benchmarking.load_trajectories("proj", art_path=str(model_dir.parents[2]))
    assert {(r["model"], r["split"], r["step"]) for r in rows} == {("good", "heldout", 0), ("weak", "heldout", 0)}
    assert sum(r["reward"] for r in rows if r["model"] == "good") == 5 and rows[0]["metric_chars"] > 0
    figure_ = benchmarking.percentage_comparison_bar_chart(rows, "reward", models=["weak", ("good", "Good model")])
    assert [t.get_text() for t in figure_.axes[0].get_xticklabels()] == ["weak", "Good model"]
    progress: Any = benchmarking.training_progress_chart(rows, "chars")
    assert progress.axes[0].get_title() == "chars"
    paths = benchmarking.generate_charts(rows, tmp_path / "charts")
    assert [p.name for p in paths] == ["reward_comparison.png", "reward_progress.png"] and all(
        p.stat().st_size for p in paths
    )


def test_the_docs_example_lists_the_base_before_the_trained_model() -> None:
    """Each model is compared with those listed before it (model minus baseline), so the base goes first."""
    page = (Path(__file__).parents[1] / "docs" / "evaluate.md").read_text()
    example = page[page.index("models=[") : page.index("],", page.index("models=["))]
    assert example.index('"my-agent@0"') < example.index("        model,")


async def test_benchmarking_rows_say_their_split_and_sampling_step_and_charts_keep_them_apart(tmp_path: Path) -> None:
    from art_agents.evaluation.files import append_run
    from art_agents.jsonl import write_groups

    def said(reward: float, **metadata: str) -> art.Trajectory:
        chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        return art.Trajectory(messages_and_choices=chat, reward=reward, metadata=metadata)

    folder = tmp_path / "proj" / "models" / "agent"
    # step 1's update trained on rollouts sampled from step 0, filed under the checkpoint it made
    write_groups(folder / "trajectories" / "train" / "0001.jsonl", [art.TrajectoryGroup([said(0.0), said(0.2)])])
    held_out = ScenarioRun(
        scenario_id="s0", index=0, rewards=[1.0], trajectories=[said(1.0, evaluated_model="agent@1")]
    )
    append_run(folder / "eval" / "heldout" / "agent@1.jsonl", held_out)
    rows = await benchmarking.load_trajectories("proj", art_path=str(tmp_path))
    assert sorted((r["split"], r["step"], r["sampled_step"], r["reward"]) for r in rows) == [
        ("heldout", 1, 1, 1.0), ("train", 1, 0, 0.0), ("train", 1, 0, 0.2),
    ]  # fmt: skip

    def bars(models: list[Any]) -> list[float]:
        return [
            bar.get_height()
            for bar in benchmarking.percentage_comparison_bar_chart(rows, "reward", models).axes[0].patches
        ]

    assert bars(["agent"]) == [1.0]  # its last step: the held-out rows only, not averaged with training rows
    assert bars([("agent", "training", "train")]) == [pytest.approx(0.1)]  # a split asked for by name

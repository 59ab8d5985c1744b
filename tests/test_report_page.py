"""`art-agents report`'s HTML page, made from a real 2-step CPU run of the tiny model plus an evaluation log.

The page is checked as text (every chart a real PNG, every trajectory listed, model text escaped), in
headless Chromium (charts shown, a collapsed step and trajectory open to readable messages), and through
the command (`RUN_DIR --html --open`, and the one line it prints without matplotlib).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import sys
import webbrowser
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import art_agents as art
from art_agents.cli.main import app, load_parts
from art_agents.local import LocalBackend
from art_agents.report.page import write_report
from art_agents.server.ops.quickstart import TOY_MODEL_CONFIG

SCRIPT = "<script>alert('escaped?')</script>"
CHART = re.compile(r'<img class="chart" id="chart-([a-z-]+)" alt="[^"]+" src="data:image/png;base64,([^"]+)">')


async def _rollout(client: Any, model: art.TrainableModel, index: int) -> art.Trajectory:
    """One sampled answer; rewards spread by index so GRPO trains, with a RULER-style score and explanation."""
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "Answer with letters only."},
            {"role": "user", "content": f"Say the letter a {index + 1} times."},
        ],
        reward=index / 3,
    )
    completion = await client.chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=6
    )
    trajectory.messages_and_choices.append(completion.choices[0])
    trajectory.metrics["ruler_score"] = index / 3
    trajectory.log(f"RULER (openai/judge) score {index / 3:.3f}: answer {index} is the <b>longest</b>")
    return trajectory


def _agent_group(step: int) -> art.TrajectoryGroup:
    """What an agent's rollout records: graph nodes, a tool call and its result, a second history, a failure."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    user = {"role": "user", "content": f"Weather in Paris? {SCRIPT}"}
    agent = art.Trajectory(
        messages=[
            {"role": "system", "content": "You are a weather agent."},
            user,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"},
            {"role": "assistant", "content": "It is sunny in Paris."},
        ],
        additional_histories=[
            art.History(messages=[{"role": "user", "content": "Summarise."}, {"role": "assistant", "content": "Sun."}])
        ],
        turns=[
            art.Turn(index=2, span="agent", model=f"agent@{step}"),
            art.Turn(index=4, span="respond", model=f"agent@{step}"),
            art.Turn(history=1, index=1, span="summarise", model=f"agent@{step}"),
        ],
        tool_calls=[
            art.ToolCallRecord(
                name="get_weather",
                arguments={"city": "Paris"},
                result="sunny, 21 C",
                duration_s=0.25,
                tool_call_id="c1",
                span="mcp:weather/get_weather",
                after_turn=1,
            )
        ],
        reward=1.0,
        metrics={"ruler_score": 0.9, "tool_calls": 1},
        logs=["RULER (openai/judge) score 0.900: used the tool", "cache miss"],
    )
    failed = art.Trajectory(messages=[user, {"role": "assistant", "content": "I cannot."}], failed=True)
    timeout = art.RolloutException.from_exception(TimeoutError("weather <b>server</b> timed out"))
    return art.TrajectoryGroup([agent, failed], exceptions=[timeout], metadata={"scenario": "paris"})


@pytest.fixture(scope="module")
async def model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Path:
    """A model folder from 2 real training steps (one group of 4 each) and one evaluation log."""
    art_path = tmp_path_factory.mktemp("report") / ".art"
    backend = LocalBackend(path=str(art_path), in_process=True)
    model = art.TrainableModel(name="agent", project="report", base_model=str(tiny_model_path), config=TOY_MODEL_CONFIG)
    await model.register(backend)
    try:
        client = model.openai_client()
        for _ in range(2):
            group = art.TrajectoryGroup([await _rollout(client, model, i) for i in range(4)])
            await model.train([group], config=art.TrainConfig(learning_rate=1e-4), progress=False)
        await model.log([_agent_group(2)], split="val")
        await client.close()
    finally:
        await backend.close()
    return art_path / "report" / "models" / "agent"


@pytest.fixture(scope="module")
def page(model_dir: Path) -> Path:
    return write_report(model_dir)


def _all_trajectory_ids(model_dir: Path) -> list[str]:
    groups = [g for path in sorted((model_dir / "trajectories").glob("*/*.jsonl")) for g in art.read_groups(path)]
    partial = [x.trajectory for g in groups for x in g.exceptions if x.trajectory]
    return [t.id for g in groups for t in g.trajectories] + [t.id for t in partial]


def test_the_page_has_real_charts_every_trajectory_and_escaped_text(model_dir: Path, page: Path) -> None:
    assert page == model_dir / "report.html"
    text = page.read_text(encoding="utf-8")
    charts = dict(CHART.findall(text))
    assert {"reward", "loss", "entropy"} <= charts.keys(), charts.keys()
    for name, data in charts.items():
        png = base64.b64decode(data, validate=True)
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5_000, name
    for name in {"reward", "loss", "kl", "entropy", "tokens-per-s", "judge-cost"} - charts.keys():
        assert f'id="chart-{name}-missing"' in text  # a note, not an empty image
    assert "http://" not in text and "https://" not in text and "<script" not in text  # no network, no script

    ids = _all_trajectory_ids(model_dir)
    assert len(ids) == 4 + 4 + 2  # two training steps of 4, the evaluation group of 2
    for trajectory_id in ids:
        assert f'data-trajectory-id="{trajectory_id}"' in text
    assert "&lt;script&gt;alert(&#x27;escaped?&#x27;)&lt;/script&gt;" in text
    assert "&lt;b&gt;longest&lt;/b&gt;" in text and "weather &lt;b&gt;server&lt;/b&gt; timed out" in text
    for shown in ("node agent", "node summarise", "agent@2", "get_weather", "mcp:weather/get_weather", "sunny, 21 C"):
        assert shown in text, shown
    history = [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()]
    assert [row.get("split", "train") for row in history] == ["train", "train", "val"]
    assert "<th>val/reward</th>" in text and "<th>reward_mean</th>" in text


def test_charts_fall_back_and_leave_out_what_no_row_has(tmp_path: Path) -> None:
    rows = [
        {"step": s, "metrics": {"reward_mean": s / 4, "reward_std": 0.1, "kl_sampler": 0.01 * s, "tokens_trained": 900,
                                "train_s": 3.0, "judge_cost_usd": 0.02}}
        for s in (1, 2, 3)
    ] + [{"step": 3, "split": "val", "metrics": {"val/reward": 0.8, "val/reward_std": 0.05, "val/n": 8}}]  # fmt: skip
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = write_report(tmp_path, tmp_path / "out.html").read_text()
    assert set(dict(CHART.findall(text))) == {"reward", "kl", "tokens-per-s", "judge-cost"}
    assert 'id="chart-loss-missing"' in text and 'id="chart-entropy-missing"' in text
    assert 'alt="KL to the sampling policy (kl_sampler) by step"' in text
    assert "No trajectories saved yet." in text


def _chrome() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (binary and driver):
        if os.environ.get("CI"):
            pytest.fail("CI must have chromium and chromedriver (.ci/run installs them with apt-get)")
        pytest.skip("no chromium/chromedriver: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    options.binary_location = binary
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))  # paths given: no download


def test_a_browser_shows_the_charts_and_opens_a_collapsed_step_to_its_messages(page: Path) -> None:
    from selenium.webdriver.common.by import By

    browser = _chrome()
    try:
        browser.get(page.as_uri())
        charts = browser.find_elements(By.CSS_SELECTOR, "img.chart")
        assert len(charts) >= 3
        for chart in charts:
            assert chart.is_displayed()
            assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", chart) > 0

        older = browser.find_element(By.ID, "train-0001")  # the newest train step starts open, this one closed
        trajectory = older.find_element(By.CSS_SELECTOR, "details.trajectory")
        question = trajectory.find_element(By.CSS_SELECTOR, ".msg.user pre")
        assert older.get_attribute("open") is None and not question.is_displayed()
        older.find_element(By.CSS_SELECTOR, ":scope > summary").click()
        trajectory.find_element(By.CSS_SELECTOR, ":scope > summary").click()
        assert question.is_displayed() and question.text.startswith("Say the letter a")

        agent = browser.find_element(By.CSS_SELECTOR, "#val-0002 details.trajectory")
        agent.find_element(By.CSS_SELECTOR, ":scope > summary").click()
        assert SCRIPT in agent.find_element(By.CSS_SELECTOR, ".msg.user pre").text  # shown as text, not run
    finally:
        browser.quit()


def test_the_report_command_takes_a_run_folder_and_writes_the_page_there(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_parts()
    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", opened.append)
    out = tmp_path / "page.html"
    server_folder = model_dir.parent.parent.parent
    result = CliRunner().invoke(app, ["report", str(server_folder), "--html", str(out), "--open"])
    assert result.exit_code == 0, result.output
    assert "report/agent" in result.output and f"report: {out}" in result.output
    assert len(CHART.findall(out.read_text())) >= 3 and opened == [out.resolve().as_uri()]

    other = server_folder / "report" / "models" / "other"
    other.mkdir()
    (other / "model.json").write_text("{}")
    try:
        both = CliRunner().invoke(app, ["report", str(server_folder), "--html", str(out)])
        assert both.exit_code == 2 and "--model" in both.output
    finally:
        shutil.rmtree(other)


def test_without_matplotlib_the_table_is_printed_and_one_line_names_the_extra(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    load_parts()
    out = tmp_path / "page.html"
    result = CliRunner().invoke(app, ["report", str(model_dir), "--html", str(out)])
    assert result.exit_code == 0, result.output
    assert "report/agent" in result.output and "reward_" in result.output  # the table (its headers wrap at "_")
    lines = [line for line in result.output.splitlines() if "art-agents[report]" in line]
    assert lines == [
        "the HTML report page needs the 'report' extra (import of matplotlib halted; None in sys.modules): "
        "pip install 'art-agents[report]' "
        "(from a clone: pip install -c constraints.txt -e '.[report]')"
    ]
    assert not out.exists()


def test_the_terminal_table_shows_an_evaluations_reward_under_the_reward_columns(tmp_path: Path) -> None:
    from rich.console import Console

    from art_agents.report.command import _table

    rows = [
        {"step": 1, "kind": "rl", "metrics": {"reward_mean": 0.25, "reward_std": 0.1, "loss": 0.5}},
        {"step": 1, "split": "val", "metrics": {"val/reward": 0.8, "val/reward_std": 0.05}},
    ]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    console = Console(record=True, width=200)
    console.print(_table(tmp_path))
    lines = [[c.strip() for c in line.split("│")[1:4]] for line in console.export_text().splitlines() if "│" in line]
    assert ["1", "0.25", "0.1"] in lines and ["1 val", "0.8", "0.05"] in lines

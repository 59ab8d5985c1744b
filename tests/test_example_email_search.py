"""examples/email_search: the inbox generator, its MCP server over stdio, the reward, the rollout, and a tiny run.

The random tiny model never calls a tool, so the rollout's tool use is shown with a scripted model
(a prompted `art_agents.Model` on a local OpenAI-compatible endpoint) against the real MCP server;
the end-to-end run checks that the server listed its tools, the rollouts offered them, and the
script's own tools check found an answer through them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ruler_fixtures import answer, judge_params, shown
from scripted_openai import ScriptedOpenAI

import art_agents as art
from art_agents.integrations.mcp import MCPServer

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "email_search"


def load(name: str, module_name: str) -> ModuleType:
    """`examples/email_search/<name>.py` (scripts beside each other, not a package) as the module `module_name`."""
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


inbox = load("inbox", "inbox")  # under the name train.py imports it by
train = load("train", "email_search_train")  # other examples have a train.py too


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The default inbox and its SQLite file."""
    data = inbox.generate_inbox(0)
    return data, inbox.write_sqlite(data, tmp_path_factory.mktemp("inbox") / "inbox.sqlite")


def server_for(database: Path, **options: Any) -> MCPServer:
    return MCPServer(command=[sys.executable, str(EXAMPLE / "mcp_server.py"), str(database)], **options)


def test_the_generator_is_seeded() -> None:
    first, again, other = inbox.generate_inbox(0), inbox.generate_inbox(0), inbox.generate_inbox(1)
    assert first == again
    assert first.emails != other.emails and first.questions != other.questions
    assert 200 <= len(first.emails) <= 400
    colleagues = {e.sender for e in first.emails if "no-reply@" not in e.sender}
    assert 24 <= len(colleagues) <= 48
    splits = [q.split for q in first.questions]
    assert splits.count("val") >= 10 and splits.count("train") >= 4 * splits.count("val") - 20
    assert {q.kind for q in first.questions} == {"meeting", "order", "invoice", "flight"}


def test_every_answer_is_in_the_email_the_question_names(generated: tuple[Any, Path]) -> None:
    data, _ = generated
    emails = {email.id: email for email in data.emails}
    assert len({q.question for q in data.questions}) == len(data.questions)  # no question asked twice
    for question in data.questions:
        assert question.answer in emails[question.email_id].body, question


def test_the_sqlite_file_holds_every_email_with_a_search_index(generated: tuple[Any, Path]) -> None:
    data, database = generated
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT count(*) FROM emails").fetchone() == (len(data.emails),)
        assert db.execute("SELECT count(*) FROM emails_fts").fetchone() == (len(data.emails),)
        row = db.execute("SELECT subject, body FROM emails WHERE id = ?", (data.emails[0].id,)).fetchone()
    assert row == (data.emails[0].subject, data.emails[0].body)
    assert not list(database.parent.glob("*.tmp"))


async def test_the_mcp_server_searches_and_reads_over_stdio(generated: tuple[Any, Path]) -> None:
    data, database = generated
    emails = {email.id: email for email in data.emails}
    async with server_for(database).session() as session:
        assert session.server_name == "email-search"
        assert [tool.name for tool in session.tools] == ["search_emails", "read_email"]
        for question in data.questions[:12]:  # the question's own words find its email first
            found = await session.call_tool("search_emails", {"query": question.question, "limit": 3})
            hits = found.structured["result"]
            assert not found.is_error and len(hits) == 3 and hits[0]["id"] == question.email_id
            assert hits[0]["subject"] == emails[question.email_id].subject
            email = await session.call_tool("read_email", {"email_id": question.email_id})
            assert question.answer in email.content and f"Subject: {hits[0]['subject']}" in email.content
        unknown = await session.call_tool("read_email", {"email_id": "e9999"})
        empty = await session.call_tool("search_emails", {"query": "?!"})
        capped = await session.call_tool("search_emails", {"query": "invoice", "limit": 500})
    assert unknown.is_error and "no email with id 'e9999'" in unknown.content
    assert empty.is_error and "has no words" in empty.content
    assert len(capped.structured["result"]) == 20


async def test_the_mcp_server_takes_its_inbox_from_the_environment(generated: tuple[Any, Path]) -> None:
    data, database = generated
    server = MCPServer(command=[sys.executable, str(EXAMPLE / "mcp_server.py")], env={"EMAIL_SEARCH_DB": str(database)})
    async with server.session() as session:
        email = await session.call_tool("read_email", {"email_id": data.emails[0].id})
    assert data.emails[0].body in email.content


@pytest.mark.parametrize(
    ("reply", "correct"),
    [
        ("I found it.\nANSWER: MA-78318", True),
        ("answer: ma-78318.", True),  # case and a final full stop do not count
        ("ANSWER: **MA-78318**", True),
        ("The order number is MA-78318.", False),  # no ANSWER line
        ("ANSWER: MA-78318 or MA-78319", False),  # two candidates are not the answer
        ("ANSWER: MA-78318\nANSWER: MA-00000", False),  # the last ANSWER line counts
        ("ANSWER: MA-7831", False),
        ("ANSWER:", False),
        (None, False),
    ],
)
def test_exact_match(reply: str | None, correct: bool) -> None:
    assert train.exact_match(reply, "MA-78318") is correct


def test_amounts_match_with_or_without_currency_and_commas() -> None:
    assert train.exact_match("ANSWER: 2721.63", "$2,721.63") and train.exact_match("ANSWER: $2,721.63", "$2,721.63")
    assert not train.exact_match("ANSWER: $2,721", "$2,721.63")


def test_no_judge_score_lifts_a_wrong_answer_to_a_right_one() -> None:
    assert train.combined_reward(True, None) == train.combined_reward(True, 0.0) == 1.0
    assert train.combined_reward(False, 1.0) == train.TIE_BREAK < 1.0
    assert train.combined_reward(False, None) == 0.0


def scripted_agent(question: Any) -> list[dict[str, Any]]:
    """What a capable agent replies, turn by turn: search, read the email, answer."""

    def call(name: str, arguments: dict[str, Any], number: int) -> dict[str, Any]:
        function = {"name": name, "arguments": json.dumps(arguments)}
        return {"content": None, "tool_calls": [{"id": f"call_{number}", "type": "function", "function": function}]}

    return [
        call("search_emails", {"query": question.question}, 1),
        call("read_email", {"email_id": question.email_id}, 2),
        {"content": f"The email says so.\nANSWER: {question.answer}"},
    ]


async def test_a_rollout_searches_reads_and_answers_through_the_mcp_server(generated: tuple[Any, Path]) -> None:
    data, database = generated
    question = next(q for q in data.questions if q.kind == "invoice")
    sampling = train.Sampling(temperature=1.0, max_tokens=64, max_turns=4)
    with ScriptedOpenAI(scripted_agent(question)) as endpoint:
        model = art.Model(name="agent", inference_base_url=endpoint.base_url, inference_api_key="sk-test")
        async with server_for(database).session() as session:
            trajectory = await train.attempt(model, question, session, sampling, data.owner)
        offered = [tool["function"]["name"] for tool in endpoint.requests[0]["tools"]]
    assert offered == ["search_emails", "read_email"]
    assert [call.name for call in trajectory.tool_calls] == ["search_emails", "read_email"]
    assert all(call.error is None for call in trajectory.tool_calls)
    assert question.email_id in trajectory.tool_calls[0].result and question.answer in trajectory.tool_calls[1].result
    assert [m.role for m in trajectory.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert trajectory.reward == 1.0 and trajectory.metadata["answer"] == question.answer
    assert trajectory.metrics["exact_match"] and trajectory.metrics["read_source"]
    assert trajectory.metrics["tool_calls"] == 2 and trajectory.metrics["turns"] == 3


def attempt_at(question: Any, text: str) -> art.Trajectory:
    trajectory = art.Trajectory(
        messages=[{"role": "user", "content": question.question}, {"role": "assistant", "content": text}],
        metadata={"question_id": question.id},
    )
    correct = text == f"ANSWER: {question.answer}"
    trajectory.reward = float(correct)
    trajectory.metrics["exact_match"] = correct
    return trajectory


async def test_the_judge_only_ranks_the_wrong_answers(generated: tuple[Any, Path]) -> None:
    data, _ = generated
    question = data.questions[0]

    def judge_favouring_the_first(body: dict[str, Any]) -> str:
        return answer([(i, 1.0 if k == 0 else 0.2) for k, (i, _) in enumerate(shown(body))])

    with ScriptedOpenAI() as judge:
        judge.default = judge_favouring_the_first
        params = judge_params(judge)
        scorer = train.GroupScorer({question.id: question}, train.Judge(params.pop("judge_model"), params))
        texts = ["ANSWER: no idea", f"ANSWER: {question.answer}", "I could not find it"]
        group = await scorer(art.TrajectoryGroup([attempt_at(question, text) for text in texts]))
        one_wrong = await scorer(art.TrajectoryGroup([attempt_at(question, t) for t in texts[:2]]))
    assert [t.reward for t in group.trajectories] == [0.5, 1.0, pytest.approx(0.1)]
    assert len(judge.requests) == 1 and len(shown(judge.requests[0])) == 2  # the right answer is not judged
    assert repr(question.answer) in judge.requests[0]["messages"][0]["content"]  # the rubric names it
    assert [t.reward for t in one_wrong.trajectories] == [0.0, 1.0]  # one wrong answer: nothing to rank


def test_the_script_explains_itself() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--help"], capture_output=True, text=True)
    assert done.returncode == 0
    for flag in ("--tiny", "--base-model", "--steps", "--questions-per-step", "--group-size", "--judge-base-url"):
        assert flag in done.stdout


def judge_by_position(body: dict[str, Any]) -> str:
    ids = [i for i, _ in shown(body)]
    return answer([(i, round(1 - k / len(ids), 3)) for k, i in enumerate(ids)])


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    # "\n" only: the tiny model's random text may hold characters str.splitlines() also splits on (U+2028...)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


@pytest.mark.slow  # a whole run on the tiny model; CI runs it with -m slow
@pytest.mark.timeout(300)
def test_a_tiny_run_trains_and_evaluates(tmp_path: Path) -> None:
    art_path = tmp_path / "art"
    env = {**os.environ, "ART_AGENTS_RULER_CACHE": str(tmp_path / "ruler-cache"), "PYTHONUNBUFFERED": "1"}
    with ScriptedOpenAI() as judge:
        judge.default = judge_by_position
        command = [
            sys.executable, str(EXAMPLE / "train.py"), "--tiny", "--art-path", str(art_path),
            "--judge-model", "openai/judge", "--judge-base-url", judge.base_url, "--judge-api-key", "sk-test",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
        judged = list(judge.requests)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "MCP server email-search: tools search_emails, read_email" in done.stdout
    assert "read_email: holds the answer" in done.stdout  # the tools, over stdio, reach an answer
    assert "held-out exact match (4 questions): before 0/4 (0%) at step 0, after" in done.stdout
    model_dir = art_path / "email-search" / "models" / "email-agent-tiny"
    assert f"run folder: {model_dir}" in done.stdout

    history = read_jsonl(model_dir / "history.jsonl")
    assert [row["step"] for row in history if row.get("kind") == "rl"] == [1, 2]
    assert [row["step"] for row in history if row.get("split") == "val"] == [0, 2]
    assert all("exact_match" in row["metrics"] and "tool_calls" in row["metrics"] for row in history if "kind" in row)
    assert all(row["metrics"]["val/n"] == 4 for row in history if row.get("split") == "val")

    trained = [
        t for group in read_jsonl(model_dir / "trajectories" / "train" / "0001.jsonl") for t in group["trajectories"]
    ]
    assert len(trained) == 4
    for trajectory in trained:  # every rollout was offered the server's tools; its calls (none, from noise) are kept
        assert [tool["function"]["name"] for tool in trajectory["tools"]] == ["search_emails", "read_email"]
        assert trajectory["metrics"]["tool_calls"] == len(trajectory["tool_calls"])
        assert 0 <= trajectory["reward"] <= 0.5 and "ruler_score" in trajectory["metrics"]
    assert len(judged) == 4 and all("search_emails" in r["messages"][1]["content"] for r in judged)

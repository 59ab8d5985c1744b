"""Train a model to answer questions about an inbox by searching and reading it over MCP (ART•E's shape).

The agent gets a question about a synthetic inbox (inbox.py) and two tools from an MCP server over
stdio (mcp_server.py): search_emails and read_email. It searches, reads, and ends with a line
`ANSWER: ...`. The reward is the exact answer first, RULER second:

    correct (the ANSWER line equals the fact the question was generated from)    1.0
    wrong or missing                                    TIE_BREAK (0.5) x the RULER score

so no judge score can lift a wrong answer to a right one's reward; the judge only ranks the wrong
attempts of a group (closer to the right email beats a blind guess), which gives GRPO something to
learn from while nothing is right yet. Held-out questions (split "val") are scored by exact match
alone, before and after training, and recorded with `model.log`.

    python examples/email_search/train.py --tiny --judge-base-url http://127.0.0.1:8000/v1   # CPU, mechanics only
    python examples/email_search/train.py --base-model Qwen/Qwen3-0.6B                       # a GPU, a real judge
"""

from __future__ import annotations

from art_agents.extras import exit_unless_installed

exit_unless_installed("examples/email_search/train.py", "server", "mcp", "ruler")  # before any import of them

import argparse
import asyncio
import os
import random
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inbox import Question, generate_inbox, write_questions, write_sqlite

import art_agents as art
from art_agents.integrations.mcp import MCPServer, MCPSession
from art_agents.ruler import KeyProblem, check_key, ruler_score_group

HERE = Path(__file__).resolve().parent
PROJECT = "email-search"
TIE_BREAK = 0.5  # the most a wrong answer can earn, from the judge; a right one earns 1.0
MAX_EXCEPTIONS = 0.1  # of a step's rollouts, how many may fail (a flaky call) before the step stops
SYSTEM_PROMPT = """You answer questions about the mailbox of {owner}.
Tools: search_emails(query, limit) finds emails by keywords and gives their ids; read_email(email_id) shows one email.
Search, read the email that answers the question, then reply with one final line:
ANSWER: <the answer, written exactly as in the email>"""
RUBRIC = """The agent answers a question about a mailbox with the tools search_emails and read_email, and must end
with one line `ANSWER: <answer>`. None of these attempts gave the right answer, {answer!r}, which is written in
email {email_id}. Rank them by how close they came:
- reading email {email_id} beats never finding it; searching with the question's own key words beats aimless searches;
- well-formed tool calls beat malformed ones, unknown tools and made-up email ids;
- a wrong ANSWER taken from an email beats a guess made without searching; no ANSWER line scores lowest.
Length and confident tone earn nothing by themselves."""
ANSWER_LINE = re.compile(r"^\s*ANSWER:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)

# --- the reward ------------------------------------------------------------------------------


def final_answer(text: str | None) -> str | None:
    """The value of the last `ANSWER:` line, or None when there is none."""
    found = ANSWER_LINE.findall(text or "")
    return found[-1] if found else None


def normalize(answer: str) -> str:
    """Case, spacing, `$`, thousands commas and surrounding punctuation do not count; anything else does."""
    text = " ".join(answer.casefold().replace("$", "").replace(",", "").split())
    return text.strip(" .;:'\"`*")


def exact_match(reply: str | None, answer: str) -> bool:
    given = final_answer(reply)
    return given is not None and normalize(given) == normalize(answer)


def combined_reward(correct: bool, judge_score: float | None) -> float:
    """1.0 for the right answer; a wrong one gets at most TIE_BREAK, from the judge's ranking of the wrong ones."""
    return 1.0 if correct else TIE_BREAK * (judge_score or 0.0)


# --- the rollout -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    temperature: float
    max_tokens: int
    max_turns: int


async def attempt(
    model: art.Model, question: Question, session: MCPSession, sampling: Sampling, owner: str, step: int | None = None
) -> art.Trajectory:
    """One try at `question`: model turns and tool calls until a reply without tool calls, or out of turns.

    `model` is a TrainableModel or any `art.Model` (a prompted baseline); `step` picks a checkpoint.
    """
    client = model.openai_client()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT.format(owner=owner)},
        {"role": "user", "content": question.question},
    ]
    reply: str | None = None
    try:
        async with art.rollout(question_id=question.id, kind=question.kind) as trajectory:
            for _ in range(sampling.max_turns):
                response = await client.chat.completions.create(
                    model=model.get_inference_name(step),
                    messages=messages,  # type: ignore[arg-type]
                    tools=session.openai_tools(),  # type: ignore[arg-type]
                    temperature=sampling.temperature,
                    max_tokens=sampling.max_tokens,
                )
                message = response.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                reply = message.content
                if not message.tool_calls:
                    break
                messages += await session.run_tool_calls(message.tool_calls)
            record_outcome(trajectory, question, reply)
    finally:
        await client.close()
    return trajectory


def record_outcome(trajectory: art.Trajectory, question: Question, reply: str | None) -> None:
    """Exact match as the reward (the judge may add to wrong ones later), and what the agent did as metrics."""
    correct = exact_match(reply, question.answer)
    read = [call.arguments for call in trajectory.tool_calls if call.name == "read_email"]
    trajectory.reward = combined_reward(correct, None)
    trajectory.metadata["answer"] = final_answer(reply)
    trajectory.metrics.update(
        exact_match=correct,
        answered=final_answer(reply) is not None,
        turns=len(trajectory.turns),
        tool_calls=len(trajectory.tool_calls),
        tool_errors=sum(call.error is not None for call in trajectory.tool_calls),
        read_source=any(isinstance(a, dict) and a.get("email_id") == question.email_id for a in read),
    )


# --- scoring a group -------------------------------------------------------------------------


@dataclass(frozen=True)
class Judge:
    model: str
    params: dict[str, Any]  # keywords of ruler_score_group: LiteLLM's (api_base, api_key) or its own (cache_dir)


class GroupScorer:
    """The gather's `after_each`: RULER ranks a group's wrong answers (when two or more can be told apart)."""

    def __init__(self, questions: dict[str, Question], judge: Judge) -> None:
        self.questions = questions
        self.judge = judge

    async def __call__(self, group: art.TrajectoryGroup) -> art.TrajectoryGroup:
        wrong = [t for t in group.trajectories if not t.metrics["exact_match"]]
        if len(wrong) < 2:
            return group  # nothing for a tie-breaker to break
        question = self.questions[wrong[0].metadata["question_id"]]
        rubric = RUBRIC.format(answer=question.answer, email_id=question.email_id)
        judged = await ruler_score_group(
            art.TrajectoryGroup(wrong), self.judge.model, rubric=rubric, **self.judge.params
        )
        scored = {t.id: t for t in judged.trajectories}
        group.trajectories = [scored.get(t.id, t) for t in group.trajectories]
        for trajectory in group.trajectories:
            trajectory.reward = combined_reward(
                bool(trajectory.metrics["exact_match"]), trajectory.metrics.get("ruler_score")
            )
        return group


# --- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Data:
    owner: str
    database: Path
    train: list[Question]
    val: list[Question]


def prepare_data(folder: Path, seed: int, val_questions: int | None) -> Data:
    """Write the inbox (SQLite) and its questions into `folder`; the same seed gives the same files."""
    inbox = generate_inbox(seed)
    database = write_sqlite(inbox, folder / "inbox.sqlite")
    write_questions(inbox.questions, folder / "questions.jsonl")
    train = [q for q in inbox.questions if q.split == "train"]
    val = [q for q in inbox.questions if q.split == "val"][:val_questions]
    return Data(inbox.owner, database, train, val)


def mcp_server(database: Path) -> MCPServer:
    return MCPServer(command=[sys.executable, str(HERE / "mcp_server.py"), str(database)], shared=True)


async def check_tools(session: MCPSession, question: Question) -> str:
    """Search with a question's words and read the best hit: the inbox must be solvable with these tools."""
    found = await session.call_tool("search_emails", {"query": question.question, "limit": 3})
    top = (found.structured or {}).get("result") or [{}]
    email = await session.call_tool("read_email", {"email_id": top[0].get("id", "")})
    holds = "holds" if question.answer in email.content else "does not hold"
    return f"search_emails({question.question!r}) -> {top[0].get('id')}; read_email: {holds} the answer {question.answer!r}"


async def evaluate(model: art.TrainableModel, data: Data, session: MCPSession, sampling: Sampling, step: int) -> int:
    """Held-out questions answered exactly at checkpoint `step` (one greedy try each); recorded with model.log."""
    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup([attempt(model, q, session, sampling, data.owner, step)]) for q in data.val),
        pbar_desc=f"eval step {step}",
    )
    await model.log(groups, split="val", step=step)
    return sum(bool(t.metrics["exact_match"]) for g in groups for t in g.trajectories)


async def train_steps(
    model: art.TrainableModel, data: Data, session: MCPSession, args: argparse.Namespace, judge: Judge
) -> None:
    """`--steps` GRPO steps, each on `--questions-per-step` training questions x `--group-size` tries."""
    sampling = Sampling(1.0, args.max_tokens, args.max_turns)
    scorer = GroupScorer({q.id: q for q in data.train}, judge)
    rng = random.Random(args.seed)
    for _ in range(args.steps):
        batch = rng.sample(data.train, min(args.questions_per_step, len(data.train)))
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(attempt(model, q, session, sampling, data.owner) for _ in range(args.group_size))
                for q in batch
            ),
            after_each=scorer,
            max_exceptions=MAX_EXCEPTIONS,
            pbar_desc="rollouts",
        )
        trajectories = [t for g in groups for t in g.trajectories]
        means = rollout_means(trajectories)  # kept in the step's history row beside the trainer's figures
        result = await model.train(groups, art.TrainConfig(learning_rate=args.learning_rate), metrics=means)
        state = "skipped (no reward spread)" if result.skipped else f"trained -> step {result.step}"
        shown = ", ".join(f"{name} {value:.2f}" for name, value in means.items())
        reward = statistics.fmean(t.reward for t in trajectories)
        print(f"{state}: reward {reward:.3f}, {shown} ({len(trajectories)} rollouts)", flush=True)


def rollout_means(trajectories: list[art.Trajectory]) -> dict[str, float]:
    """Per-rollout means of a step: how often right, how often answered, how the tools were used."""
    metrics = ("exact_match", "answered", "tool_calls", "tool_errors", "read_source")
    return {metric: statistics.fmean(float(t.metrics[metric]) for t in trajectories) for metric in metrics}


async def run(args: argparse.Namespace) -> None:
    art_path = Path(args.art_path).resolve()
    data = prepare_data(art_path / PROJECT / "data", args.seed, args.val_questions)
    base_model = args.base_model
    if args.tiny:
        from art_agents.server.ops.tiny_model import build_tiny_model

        base_model = str(build_tiny_model(art_path / "tiny-model"))
    print(f"inbox {data.database}: {len(data.train)} training and {len(data.val)} held-out questions")
    rollouts = args.questions_per_step * args.group_size
    config = art.ModelConfig(max_batch_size=max(rollouts, len(data.val)), default_max_tokens=args.max_tokens)
    name = "email-agent-tiny" if args.tiny else "email-agent"
    model = art.TrainableModel(name=name, project=PROJECT, base_model=base_model, config=config)
    backend = art.LocalBackend(art_path)
    judge = Judge(args.judge_model, judge_params(args))
    eval_sampling = Sampling(0.0, args.max_tokens, args.max_turns)
    try:
        await model.register(backend)
        async with mcp_server(data.database) as server, server.session() as session:
            print(f"MCP server {session.server_name}: tools {', '.join(t.name for t in session.tools)}")
            print(f"tools check: {await check_tools(session, data.train[0])}")
            before = await evaluate(model, data, session, eval_sampling, step=0)
            await train_steps(model, data, session, args, judge)
            step = await model.get_step()
            after = await evaluate(model, data, session, eval_sampling, step=step)
    finally:
        await backend.close()
    count = len(data.val)
    print(
        f"held-out exact match ({count} questions): before {before}/{count} ({before / count:.0%}) at step 0, "
        f"after {after}/{count} ({after / count:.0%}) at step {step}"
    )
    print(f"run folder: {art_path / PROJECT / 'models' / name}")


def judge_params(args: argparse.Namespace) -> dict[str, Any]:
    given = {"api_base": args.judge_base_url, "api_key": args.judge_api_key}
    return {key: value for key, value in given.items() if value}


TINY = {"steps": 2, "questions_per_step": 2, "group_size": 2, "val_questions": 4, "max_tokens": 16, "max_turns": 2}
FULL = {
    "steps": 50,
    "questions_per_step": 8,
    "group_size": 6,
    "val_questions": None,
    "max_tokens": 1024,
    "max_turns": 6,
}


def count(text: str) -> int:
    """A whole number of at least 1, for argparse."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def defaults(key: str) -> str:
    return f"(default {FULL[key] or 'all'}; --tiny {TINY[key]})"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-model", default="Qwen/Qwen3-0.6B", help="hub id or local folder (default: %(default)s)")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="the random tiny model and a short run: checks the mechanics, learns nothing",
    )
    parser.add_argument("--steps", type=count, help=f"GRPO steps {defaults('steps')}")
    parser.add_argument(
        "--questions-per-step", type=count, help=f"training questions per step {defaults('questions_per_step')}"
    )
    parser.add_argument(
        "--group-size", type=count, help=f"tries per question, compared with each other {defaults('group_size')}"
    )
    parser.add_argument("--val-questions", type=count, help=f"held-out questions evaluated {defaults('val_questions')}")
    parser.add_argument("--max-tokens", type=count, help=f"completion budget per model turn {defaults('max_tokens')}")
    parser.add_argument("--max-turns", type=count, help=f"model turns per try {defaults('max_turns')}")
    parser.add_argument("--learning-rate", type=float, default=5e-4, help="LoRA learning rate (default %(default)s)")
    parser.add_argument("--art-path", default=".art", help="server folder: checkpoints, history (default %(default)s)")
    parser.add_argument("--judge-model", default="openai/gpt-4.1-mini", help="RULER judge, any LiteLLM model string")
    parser.add_argument(
        "--judge-base-url",
        default=os.environ.get("JUDGE_BASE_URL"),
        help="OpenAI-compatible judge endpoint ($JUDGE_BASE_URL)",
    )
    parser.add_argument("--judge-api-key", default=os.environ.get("JUDGE_API_KEY"), help="its key ($JUDGE_API_KEY)")
    parser.add_argument("--seed", type=int, default=0, help="inbox and question sampling seed (default %(default)s)")
    args = parser.parse_args(argv)
    for key, value in (TINY if args.tiny else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main() -> None:
    args = parse_args()
    try:  # the judge's key, before minutes of loading and rollouts
        check_key(
            args.judge_model,
            judge_params(args),
            role="judge",
            option="--judge-api-key (or a --judge-base-url of your own)",
        )
    except KeyProblem as exc:
        raise SystemExit(f"error: {exc}") from None
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

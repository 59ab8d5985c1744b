"""A planner and a worker in one LangGraph workflow, trained together with GRPO on word problems.

Many agents are several LLM nodes in one graph. Here a planner writes a short plan for a word problem and a worker
follows it step by step with two tools defined in code (a calculator and a unit converter). Both nodes call the
same served model, so one trajectory holds the planner's call, the worker's calls (each turn names its LangGraph
node) and the tool runs, and one update trains both roles. The graph is ordinary LangGraph code: the only
art-agents lines are `model.chat_model(...)` for the LLM and `wrap(graph)` around the compiled graph.

The problems (speeds, recipes, volumes, lengths, change from a purchase) are generated in code with exact answers
(fractions, never floats). The reward reads only a final `ANSWER: <number>` line and compares the number with the
exact answer, so nothing but the right number earns it; README.md says why format tricks earn nothing.

    python examples/langgraph_planner/train.py --tiny                          # CPU: the random tiny model, ~20 s
    python examples/langgraph_planner/train.py --base-model Qwen/Qwen3-0.6B    # a GPU: a real run
"""

from __future__ import annotations

from art_agents.extras import exit_unless_installed

exit_unless_installed("examples/langgraph_planner/train.py", "server", "langgraph")  # before any import of them

import argparse
import ast
import asyncio
import operator
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode

from art_agents import (
    LocalBackend,
    TrainableModel,
    TrainConfig,
    Trajectory,
    TrajectoryGroup,
    gather_trajectory_groups,
)
from art_agents.integrations.langgraph import WrappedGraph, wrap

PROJECT = "langgraph-planner"
MAX_WORKER_CALLS = 6  # the worker's tool loop ends here, answered or not
MAX_EXCEPTIONS = 0.25  # share of a gather's rollouts that may fail (counted, not trained on)

# --- word problems with exact answers -------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    question: str
    answer: Fraction
    kind: str


def _speed(rng: random.Random) -> Problem:
    speed, minutes = rng.randint(6, 45), 3 * rng.randint(1, 60)
    question = f"A cyclist rides at {speed} km/h for {minutes} minutes. How many metres does she cover?"
    return Problem(question, Fraction(speed * 1000 * minutes, 60), "speed")


def _flour(rng: random.Random) -> Problem:
    grams, loaves, days = rng.randrange(250, 801, 25), rng.randint(3, 40), rng.randint(2, 14)
    question = (
        f"A bakery uses {grams} g of flour per loaf and bakes {loaves} loaves a day. "
        f"How many kilograms of flour does it use in {days} days?"
    )
    return Problem(question, Fraction(grams * loaves * days, 1000), "flour")


def _bottles(rng: random.Random) -> Problem:
    crates, bottles, broken = rng.randint(2, 40), rng.choice([6, 12, 20, 24]), rng.randint(1, 5)
    ml = rng.choice([250, 330, 500, 750, 1000, 1500])
    question = (
        f"{crates} crates each hold {bottles} bottles of {ml} mL, and {broken} of the bottles broke. "
        "How many litres are left in the unbroken bottles?"
    )
    return Problem(question, Fraction((crates * bottles - broken) * ml, 1000), "bottles")


def _shelves(rng: random.Random) -> Problem:
    shelves, feet, inches = rng.randint(2, 12), rng.randint(2, 9), rng.randint(1, 11)
    question = (
        f"A bookcase has {shelves} shelves, each {feet} feet {inches} inches long. "
        "How many centimetres of shelf is that in total?"
    )
    return Problem(question, shelves * (12 * feet + inches) * Fraction(254, 100), "shelves")


def _change(rng: random.Random) -> Problem:
    notebook, pen = rng.randint(150, 650), rng.randint(40, 250)  # cents
    notebooks, pens = rng.randint(1, 5), rng.randint(1, 6)
    total = notebooks * notebook + pens * pen
    note = next(cents for cents in (1000, 2000, 5000) if cents > total)
    question = (
        f"Notebooks cost ${notebook / 100:.2f} each and pens ${pen / 100:.2f} each. Ana buys {notebooks} notebooks "
        f"and {pens} pens and pays with a ${note // 100} note. How much change does she get, in dollars?"
    )
    return Problem(question, Fraction(note - total, 100), "change")


KINDS: list[Callable[[random.Random], Problem]] = [_speed, _flour, _bottles, _shelves, _change]


def make_problems(count: int, seed: int, exclude: Iterable[str] = ()) -> list[Problem]:
    """`count` distinct problems, the kinds in turn; questions in `exclude` (held-out ones) are never drawn."""
    rng, seen, problems, draws = random.Random(seed), set(exclude), [], 0
    while len(problems) < count:
        if draws == 100 * count:  # the smallest kind (shelves) has 968 distinct problems
            raise ValueError(f"could not draw {count} distinct problems: ask for fewer (a few thousand at most)")
        draws += 1
        problem = KINDS[len(problems) % len(KINDS)](rng)
        if problem.question not in seen:
            seen.add(problem.question)
            problems.append(problem)
    return problems


# --- the tools ------------------------------------------------------------------------------------

_OPERATORS: dict[type[ast.AST], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def format_number(value: Fraction) -> str:
    """A fraction as a plain decimal: exact when it terminates (1/8 -> 0.125), else rounded to 6 places."""
    with localcontext() as context:
        context.prec = 60
        decimal = Decimal(value.numerator) / Decimal(value.denominator)
        denominator = value.denominator
        for prime in (2, 5):
            while denominator % prime == 0:
                denominator //= prime
        if denominator != 1:
            decimal = decimal.quantize(Decimal("1e-6"))
        return format(decimal.normalize(), "f")


def evaluate_expression(expression: str) -> Fraction:
    """+, -, *, / and parentheses over decimal numbers, computed exactly; anything else is a ValueError."""
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    return _evaluate(ast.parse(expression.strip(), mode="eval").body)


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))  # type: ignore[no-any-return]
    raise ValueError(f"unsupported: {ast.unparse(node)!r} (use numbers, + - * / and parentheses)")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. "(12 * 30 + 5) / 4". Supports + - * / and parentheses."""
    try:
        return format_number(evaluate_expression(expression))
    except ZeroDivisionError:
        return "error: division by zero"
    except (ValueError, SyntaxError) as exc:
        return f"error: {exc}"


# unit -> (dimension, size in the dimension's base unit: metre, gram, millilitre, second); exact factors only
UNITS: dict[str, tuple[str, Fraction]] = {
    "mm": ("length", Fraction(1, 1000)),
    "cm": ("length", Fraction(1, 100)),
    "m": ("length", Fraction(1)),
    "km": ("length", Fraction(1000)),
    "in": ("length", Fraction(254, 10000)),
    "ft": ("length", Fraction(3048, 10000)),
    "yd": ("length", Fraction(9144, 10000)),
    "mi": ("length", Fraction(1609344, 1000)),
    "mg": ("mass", Fraction(1, 1000)),
    "g": ("mass", Fraction(1)),
    "kg": ("mass", Fraction(1000)),
    "lb": ("mass", Fraction(45359237, 100000)),
    "oz": ("mass", Fraction(45359237, 1600000)),
    "ml": ("volume", Fraction(1)),
    "l": ("volume", Fraction(1000)),
    "s": ("time", Fraction(1)),
    "min": ("time", Fraction(60)),
    "h": ("time", Fraction(3600)),
    "day": ("time", Fraction(86400)),
}
UNIT_NAMES = {
    "millimetre": "mm", "millimeter": "mm", "centimetre": "cm", "centimeter": "cm", "metre": "m", "meter": "m",
    "kilometre": "km", "kilometer": "km", "inch": "in", "inches": "in", "foot": "ft", "feet": "ft", "yard": "yd",
    "mile": "mi", "milligram": "mg", "gram": "g", "kilogram": "kg", "pound": "lb", "ounce": "oz",
    "millilitre": "ml", "milliliter": "ml", "litre": "l", "liter": "l", "second": "s", "minute": "min", "hour": "h",
}  # fmt: skip


def unit(name: str) -> tuple[str, Fraction]:
    """(dimension, size) of a unit given as a symbol or a name, singular or plural ("km", "Kilometres")."""
    key = name.strip().lower()
    for candidate in (key, key.removesuffix("s")):
        candidate = UNIT_NAMES.get(candidate, candidate)
        if candidate in UNITS:
            return UNITS[candidate]
    raise ValueError(f"unknown unit {name!r}; known: {', '.join(UNITS)}")


def convert(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a quantity between units of length (mm cm m km in ft yd mi), mass (mg g kg lb oz),
    volume (ml l) or time (s min h day), e.g. convert(2.5, "km", "m") -> "2500 m"."""
    try:
        (source, size), (target, target_size) = unit(from_unit), unit(to_unit)
    except ValueError as exc:
        return f"error: {exc}"
    if source != target:
        return f"error: cannot convert {source} ({from_unit}) to {target} ({to_unit})"
    return f"{format_number(Fraction(str(value)) * size / target_size)} {to_unit}"


# --- the reward -----------------------------------------------------------------------------------

# The whole last line: one number (optionally $, thousands commas, a unit word, a full stop) and nothing else.
ANSWER_LINE = re.compile(r"ANSWER:\s*\$?(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)(?:\s*[A-Za-z]+)?\.?")
RELATIVE_TOLERANCE = Fraction(1, 10**6)  # float round-off in a model's own arithmetic, nothing more
ABSOLUTE_TOLERANCE = Fraction(1, 10**9)
BREVITY_WEIGHT = 0.1  # the most that writing can cost: a wrong answer never reaches a right one
CHARS_FOR_FULL_COST = 4000


def parse_answer(text: str) -> Fraction | None:
    """The number on the reply's last non-empty line when that line is exactly `ANSWER: <number>`, else None."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    match = ANSWER_LINE.fullmatch(lines[-1]) if lines else None
    return Fraction(match.group(1).replace(",", "")) if match else None


def is_correct(value: Fraction | None, answer: Fraction) -> bool:
    return value is not None and abs(value - answer) <= max(ABSOLUTE_TOLERANCE, RELATIVE_TOLERANCE * abs(answer))


def reward(correct: bool, chars_written: int) -> float:
    """1 for the right number, minus a brevity cost of at most 0.1: right is in [0.9, 1], wrong in [-0.1, 0]."""
    return float(correct) - BREVITY_WEIGHT * min(1.0, chars_written / CHARS_FOR_FULL_COST)


def chars_written(trajectory: Trajectory) -> int:
    """What the agent wrote in all its nodes: the text and the tool-call arguments of every assistant message."""
    return sum(
        len(message.text()) + sum(len(str(call.function.arguments)) for call in message.tool_calls or [])
        for history in trajectory.histories()
        for message in history.messages
        if message.role == "assistant"
    )


def node_calls(trajectory: Trajectory) -> dict[str, int]:
    """Model calls per LangGraph node (the wrapper records each call's node as `turn.span`) and tool runs."""
    spans = Counter(turn.span for turn in trajectory.turns)
    return {
        "planner_calls": spans["planner"],
        "worker_calls": spans["worker"],
        "tool_calls": len(trajectory.tool_calls),
    }


def grader(problem: Problem) -> Callable[[dict[str, Any], Trajectory], float]:
    """The reward for `agent.rollout`: reads the worker's last reply; records what it found as trajectory metrics."""

    def grade(output: dict[str, Any], trajectory: Trajectory) -> float:
        value = parse_answer(output["messages"][-1].text)
        correct, written = is_correct(value, problem.answer), chars_written(trajectory)
        trajectory.metrics.update(
            correct=correct, answered=value is not None, chars_written=written, **node_calls(trajectory)
        )
        return reward(correct, written)

    return grade


# --- the graph: planner -> worker <-> tools -------------------------------------------------------

PLANNER_PROMPT = (
    "You plan the solution of a word problem for a worker who has two tools: `calculator` (exact arithmetic) and "
    "`convert` (units of length, mass, volume and time). Write a numbered plan of at most four short steps. "
    "Do not compute the answer yourself."
)
WORKER_PROMPT = (
    "You solve a word problem by following the plan step by step. Use `calculator` for every computation and "
    "`convert` for every change of unit. When you are done, end your reply with one last line, exactly "
    "`ANSWER: <number>`, giving the number in the unit the question asks for."
)


class PlanState(MessagesState):
    """The task, the planner's plan, and in `messages` the worker's replies and tool results."""

    task: str
    plan: str


def after_worker(state: PlanState) -> str:
    """Run the tools the worker asked for, unless it is done or out of calls."""
    last = state["messages"][-1]
    calls = sum(isinstance(message, AIMessage) for message in state["messages"])
    return "tools" if isinstance(last, AIMessage) and last.tool_calls and calls < MAX_WORKER_CALLS else END


def build_graph(llm: ChatOpenAI) -> CompiledStateGraph:
    """The compiled workflow; `llm` (here `model.chat_model(...)`) is shared by both nodes: one model plays both roles."""
    tools = [tool(calculator), tool(convert)]
    worker_llm = llm.bind_tools(tools)

    async def planner(state: PlanState) -> dict[str, Any]:
        reply = await llm.ainvoke([SystemMessage(PLANNER_PROMPT), HumanMessage(state["task"])])
        return {"plan": reply.text}

    async def worker(state: PlanState) -> dict[str, Any]:
        brief = HumanMessage(f"Task: {state['task']}\n\nPlan:\n{state['plan']}")
        return {"messages": [await worker_llm.ainvoke([SystemMessage(WORKER_PROMPT), brief, *state["messages"]])]}

    graph = StateGraph(PlanState)
    graph.add_node("planner", planner)
    graph.add_node("worker", worker)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "worker")
    graph.add_conditional_edges("worker", after_worker, ["tools", END])
    graph.add_edge("tools", "worker")
    return graph.compile()


def graph_input(problem: Problem) -> dict[str, Any]:
    return {"task": problem.question, "messages": []}


# --- training and evaluation ----------------------------------------------------------------------

# (full run, --tiny) defaults of the options that --tiny changes; an option given on the command line wins
DEFAULTS: dict[str, tuple[int, int]] = {
    "steps": (20, 2),
    "problems_per_step": (8, 2),
    "group_size": (8, 3),
    "eval_problems": (50, 4),
    "max_tokens": (1024, 12),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-model", default="Qwen/Qwen3-0.6B", help="hub id or local folder (default: %(default)s)")
    parser.add_argument("--tiny", action="store_true", help="build and train the random tiny model (CPU, CI)")
    options = {
        "steps": "training steps",
        "problems_per_step": "problems (groups) per step",
        "group_size": "rollouts per problem",
        "eval_problems": "held-out problems, evaluated before and after training",
        "max_tokens": "max tokens of every model call",
    }
    for name, meaning in options.items():
        full, tiny = DEFAULTS[name]
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=int, help=f"{meaning} (default: {full}; {tiny} with --tiny)")
    parser.add_argument("--learning-rate", type=float, default=5e-4, help="LoRA learning rate (default: %(default)s)")
    parser.add_argument("--art-path", default=".art", help="server folder: models, checkpoints (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="problem generator seed (default: %(default)s)")
    args = parser.parse_args(argv)
    for name, (full, tiny) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else full)
    return args


async def attempts(agent: WrappedGraph, problems: list[Problem], group_size: int) -> list[TrajectoryGroup]:
    """`group_size` scored rollouts of each problem, a group per problem."""
    return await gather_trajectory_groups(
        [TrajectoryGroup(agent.rollout(graph_input(p), reward=grader(p)) for _ in range(group_size)) for p in problems],
        max_exceptions=MAX_EXCEPTIONS,
    )


def trajectories(groups: list[TrajectoryGroup]) -> list[Trajectory]:
    return [trajectory for group in groups for trajectory in group.trajectories]


async def evaluate(
    model: TrainableModel, agent: WrappedGraph, problems: list[Problem]
) -> tuple[int, int, list[Trajectory]]:
    """One greedy rollout per held-out problem, logged as `split="val"`; (step, problems solved, trajectories).

    A rollout that failed counts as unsolved.
    """
    groups = await attempts(agent, problems, group_size=1)
    logged = await model.log(groups, split="val")
    done = trajectories(groups)
    return logged.step, sum(bool(t.metrics.get("correct")) for t in done), done


def calls_per_rollout(rollouts: list[Trajectory]) -> str:
    totals = Counter[str]()
    for trajectory in rollouts:
        totals.update(node_calls(trajectory))
    n = max(len(rollouts), 1)
    return (
        f"planner {totals['planner_calls'] / n:.2f}, worker {totals['worker_calls'] / n:.2f} "
        f"(tool runs {totals['tool_calls'] / n:.2f})"
    )


async def run(args: argparse.Namespace) -> None:
    art_path = Path(args.art_path).resolve()
    if args.tiny:
        from art_agents.server.ops.tiny_model import build_tiny_model

        base_model, name = str(build_tiny_model(art_path / "tiny-model")), "planner-worker-tiny"
    else:
        base_model, name = args.base_model, "planner-worker"
    held_out = make_problems(args.eval_problems, seed=10_000 + args.seed)
    train_problems = make_problems(
        args.steps * args.problems_per_step, seed=args.seed, exclude=(p.question for p in held_out)
    )
    backend = LocalBackend(art_path)
    model = TrainableModel(name=name, project=PROJECT, base_model=base_model)
    # The brevity cost is kept as small in the update as in the reward: advantages are not divided by the
    # group's reward std (Dr. GRPO), which would blow a few characters' difference up to a full unit.
    config = TrainConfig(learning_rate=args.learning_rate, scale_rewards=False)
    rollouts: list[Trajectory] = []
    print(f"model {base_model}; {len(train_problems)} training problems, {len(held_out)} held-out; art path {art_path}")
    try:
        await model.register(backend)
        sampled = wrap(build_graph(model.chat_model(temperature=1.0, max_tokens=args.max_tokens)), model=model)
        greedy = wrap(build_graph(model.chat_model(temperature=0.0, max_tokens=args.max_tokens)), model=model)
        before_step, before, done = await evaluate(model, greedy, held_out)
        rollouts += done
        for index in range(args.steps):
            problems = train_problems[index * args.problems_per_step : (index + 1) * args.problems_per_step]
            groups = await attempts(sampled, problems, args.group_size)
            rollouts += trajectories(groups)
            result = await model.train(groups, config)
            solved = sum(bool(t.metrics.get("correct")) for t in trajectories(groups))
            outcome = "skipped: every group scored alike" if result.skipped else f"now serving step {result.step}"
            print(
                f"step {index + 1}/{args.steps}: reward {result.metrics['reward_mean']:.3f}, "
                f"solved {solved}/{len(trajectories(groups))}; {outcome}"
            )
        after_step, after, done = await evaluate(model, greedy, held_out)
        rollouts += done
    finally:
        await backend.close()
    total = len(held_out)
    print(
        f"held-out accuracy: {before}/{total} ({before / total:.0%}) at step {before_step} -> "
        f"{after}/{total} ({after / total:.0%}) at step {after_step}"
    )
    print(f"model calls per rollout over {len(rollouts)} rollouts: {calls_per_rollout(rollouts)}")
    print(f"run folder: {art_path / PROJECT / 'models' / name} (history.jsonl, trajectories/)")


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()

"""The task sets of `mcp_rl.py`: a real MCP server from PyPI, tasks built in code with known answers, and how the
model is told to use the server (system prompt, three worked examples as turns of the conversation).

  calculator  `mcp-server-calculator`: arithmetic word problems with numbers too large for a 135M model to do in
              its head, so success needs a `calculate` call. No state.
  sqlite      `mcp-server-sqlite`: questions about a shop's orders in a SQLite database the server holds (the
              state: 60 orders, seeded), answered by a `read_query` with the right SELECT. Triggers refuse
              INSERT, UPDATE and DELETE on the orders, and `reset` puts the pristine file back before each step
              and evaluation if a rollout changed it otherwise (a DROP), so no rollout changes what others see.

No strong generator model is reachable offline, and a task's right answer must be known to check it: so tasks are
templates filled in code (seeded), split into training and held-out tasks. Each carries the tool call that solves
it, which only the scripted teacher of the SFT warmup uses.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import shutil
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_agents.autorl.scenarios import Scenario


@dataclass(frozen=True)
class Solved:
    """A task and the tool call that solves it."""

    scenario: Scenario
    tool: str
    arguments: dict[str, Any]

    def hint(self, with_result: bool = True) -> str:
        """The solution as privileged context for self-distillation: the call, what it returns, the answer; or,
        without the result, only the way to it (the call, then reporting what it returns)."""
        answer = self.scenario.reference_answer
        call = f"call {self.tool} with {json.dumps(self.arguments)}"
        if not with_result:
            return f"{call}; then call complete_task with the answer the tool returns."
        return f"{call}; it returns {answer}; then call complete_task with {json.dumps({'answer': answer})}."


@dataclass(frozen=True)
class TaskSet:
    name: str
    package: str  # on PyPI; its console script has the same name
    requirements: tuple[str, ...]  # pins its metadata lacks
    system: str
    tool: str  # the tool the worked examples call
    worked: tuple[tuple[str, dict[str, Any], str, str], ...]  # (question, arguments, the tool's result, answer)
    build: Callable[[int, int], list[Solved]]  # (count, seed) -> tasks in a seeded order
    database: bool = False  # the server holds the shop's database: passed as --db-path, put back by `reset`

    def examples(self) -> list[dict[str, Any]]:
        """The worked examples as turns: the task, the tool call, its result, `complete_task`, its result.
        (With the calculator, one example gave 4 of 32 parseable-looking calls, three gave 22.)"""
        return worked_turns(self.tool, self.worked)

    def solved(self, count: int, val_count: int, seed: int = 0) -> list[Solved]:
        """`count` tasks (fewer if the templates run out) in a seeded order, the first `val_count` held out."""
        tasks = self.build(count, seed)
        for task in tasks[:val_count]:
            task.scenario.split = "val"
        return tasks

    def reset(self, folder: Path) -> bool:
        """Put the server's state back as it was built; whether it had changed."""
        return self.database and reset_shop(folder)

    def command(self, folder: Path) -> list[str]:
        """argv of the server, in a venv of its own (both need `mcp<2`); the database goes into `folder`."""
        from mcp_fixtures import isolated_server_command

        argv = isolated_server_command(self.package, self.package, *self.requirements)
        return [*argv, "--db-path", str(shop_database(folder))] if self.database else argv


def worked_turns(tool: str, worked: Iterable[tuple[str, dict[str, Any], str, str]]) -> list[dict[str, Any]]:
    """Worked examples (question, arguments, the tool's result, answer) as turns: the task, the call of `tool`, its
    result, `complete_task` with the answer, its result."""
    messages: list[dict[str, Any]] = []
    for index, (question, arguments, result, answer) in enumerate(worked):
        messages += [
            {"role": "user", "content": question},
            _call(f"tool{index}", tool, arguments),
            {"role": "tool", "tool_call_id": f"tool{index}", "content": result},
            _call(f"done{index}", "complete_task", {"answer": answer}),
            {"role": "tool", "tool_call_id": f"done{index}", "content": "Task complete."},
        ]
    return messages


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def _scenario(index: int, prefix: str, task: str, answer: float, difficulty: int) -> Scenario:
    reference = str(int(answer)) if float(answer).is_integer() else f"{answer:.4f}"
    return Scenario(
        id=f"{prefix}{index:03d}", split="train", task=task, difficulty=difficulty, reference_answer=reference
    )


ARITHMETIC = [
    ("What is {a} * {b}?", "{a} * {b}"),
    ("Compute {a} + {b} * {c}.", "{a} + {b} * {c}"),
    ("A box holds {b} items. How many items are in {a} boxes?", "{a} * {b}"),
    ("What is {a} minus {b}, multiplied by {c}?", "({a} - {b}) * {c}"),
    ("Calculate ({a} + {b}) * {c}.", "({a} + {b}) * {c}"),
    ("A ticket costs {b} dollars. What do {a} tickets cost, in dollars?", "{a} * {b}"),
    ("What is {a} squared plus {b}?", "{a} ** 2 + {b}"),
    ("Divide {p} by {b}.", "{p} / {b}"),
]


def calculator_tasks(count: int, seed: int) -> list[Solved]:
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        question, expression = ARITHMETIC[index % len(ARITHMETIC)]
        a, b, c = rng.randint(23, 989), rng.randint(13, 97), rng.randint(3, 29)
        values = {"a": a, "b": b, "c": c, "p": a * b}
        filled = expression.format(**values)
        answer = eval(filled)  # our own template, not model output
        scenario = _scenario(index, "calc", question.format(**values), answer, 1 if filled.count(" ") <= 2 else 2)
        tasks.append(Solved(scenario, "calculate", {"expression": filled}))
    rng.shuffle(tasks)
    return tasks


CALCULATOR = TaskSet(
    name="calculator",
    package="mcp-server-calculator",
    requirements=(),
    system=(
        "You are a careful assistant with a calculator. Never do arithmetic in your head: call the calculate "
        "tool with the expression, read its result, then call complete_task with the final number."
    ),
    tool="calculate",
    worked=(
        ("What is 123 * 45?", {"expression": "123 * 45"}, "5535", "5535"),
        ("Compute 17 + 250 * 3.", {"expression": "17 + 250 * 3"}, "767", "767"),
        ("What is 96 minus 14, multiplied by 7?", {"expression": "(96 - 14) * 7"}, "574", "574"),
    ),
    build=calculator_tasks,
)

CUSTOMERS = ["Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana"]
ITEMS = ["lamp", "chair", "desk", "kettle", "rug", "shelf"]
CITIES = ["Lyon", "Osaka", "Quito", "Perth", "Tunis"]
SHOP_SEED = 7
QUESTIONS = [  # (question, SQL), over one or two of customer / item / city
    ("How many orders did {customer} place?", "SELECT COUNT(*) FROM orders WHERE customer = '{customer}'"),
    ("How many units of {item} were ordered in total?", "SELECT SUM(quantity) FROM orders WHERE item = '{item}'"),
    ("How many orders were shipped to {city}?", "SELECT COUNT(*) FROM orders WHERE city = '{city}'"),
    ("What is the largest quantity {customer} ordered at once?",
     "SELECT MAX(quantity) FROM orders WHERE customer = '{customer}'"),
    ("How many units of {item} did {customer} order?",
     "SELECT SUM(quantity) FROM orders WHERE customer = '{customer}' AND item = '{item}'"),
    ("How many orders of {item} went to {city}?", "SELECT COUNT(*) FROM orders WHERE item = '{item}' AND city = '{city}'"),
]  # fmt: skip


def shop_orders() -> list[tuple[int, str, str, int, str]]:
    rng = random.Random(SHOP_SEED)
    return [(i, rng.choice(CUSTOMERS), rng.choice(ITEMS), rng.randint(1, 40), rng.choice(CITIES)) for i in range(1, 61)]


SCHEMA = "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, item TEXT, quantity INTEGER, city TEXT)"


def _fill_shop(db: sqlite3.Connection) -> None:
    db.execute(SCHEMA)
    db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", shop_orders())


def shop_database(folder: Path) -> Path:
    """The shop's database, with triggers that refuse changes to its orders (file modes do not stop root)."""
    path, pristine = folder / "shop.sqlite", folder / "shop.pristine.sqlite"
    if not pristine.exists():
        with contextlib.closing(sqlite3.connect(pristine)) as db, db:
            _fill_shop(db)
            for change in ("INSERT", "UPDATE", "DELETE"):
                db.execute(
                    f"CREATE TRIGGER read_only_{change.lower()} BEFORE {change} ON orders "
                    "BEGIN SELECT RAISE(ABORT, 'the orders are read-only'); END"
                )
    if not path.exists():
        shutil.copyfile(pristine, path)
    return path


def reset_shop(folder: Path) -> bool:
    path, pristine = shop_database(folder), folder / "shop.pristine.sqlite"
    if path.read_bytes() == pristine.read_bytes():
        return False
    shutil.copyfile(pristine, path)
    return True


def sqlite_tasks(count: int, seed: int) -> list[Solved]:
    """Questions over the shop whose answer is a number (a SUM over no rows has none), in a seeded order."""
    db = sqlite3.connect(":memory:")
    _fill_shop(db)
    filled = []
    for question, sql in QUESTIONS:
        for customer, item, city in itertools.product(CUSTOMERS, ITEMS, CITIES):
            values = {"customer": customer, "item": item, "city": city}
            pair = (question.format(**values), sql.format(**values))
            if pair not in filled:
                filled.append(pair)
    random.Random(seed).shuffle(filled)
    tasks = []
    for question, sql in filled:
        (answer,) = db.execute(sql).fetchone()
        if answer is None or len(tasks) == count:
            continue
        difficulty = 2 if " AND " in sql else 1
        tasks.append(Solved(_scenario(len(tasks), "shop", question, answer, difficulty), "read_query", {"query": sql}))
    db.close()
    return tasks


SQLITE = TaskSet(
    name="sqlite",
    package="mcp-server-sqlite",
    requirements=("mcp<2",),  # it asks for mcp>=1.0 but uses the low-level decorators mcp 2 removed
    system=(
        "You are a careful assistant with a shop's SQLite database. Its table orders has the columns id, customer, "
        "item, quantity and city. Never guess: call read_query with one SELECT that answers the question, read its "
        "result, then call complete_task with the final number."
    ),
    tool="read_query",
    worked=(
        (
            "How many orders did Ines place?",
            {"query": "SELECT COUNT(*) FROM orders WHERE customer = 'Ines'"},
            "[{'COUNT(*)': 4}]",
            "4",
        ),
        (
            "How many units of sofa were ordered in total?",
            {"query": "SELECT SUM(quantity) FROM orders WHERE item = 'sofa'"},
            "[{'SUM(quantity)': 57}]",
            "57",
        ),
        (
            "How many orders of vase went to Oslo?",
            {"query": "SELECT COUNT(*) FROM orders WHERE item = 'vase' AND city = 'Oslo'"},
            "[{'COUNT(*)': 2}]",
            "2",
        ),
    ),
    build=sqlite_tasks,
    database=True,
)

TASK_SETS = {task_set.name: task_set for task_set in (CALCULATOR, SQLITE)}

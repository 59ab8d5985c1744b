"""MCP•RL scenarios: tasks a user would give an agent holding an MCP server's tools.

Written by a generator model from the server's tools, resources and instructions, split into
train and val once, and saved as `scenarios.jsonl` in the run folder so a rerun trains on the same
tasks and evaluates on the same held-out ones.
"""

from __future__ import annotations

import json
import random
from typing import Any, Literal

from pydantic import Field

from art_agents.autorl.generation import Generated, generate_items
from art_agents.schema import Schema

SCENARIO_SYSTEM = """You write training tasks for an AI agent that can use the tools of one MCP server.
Each task is something a real user would ask an assistant holding exactly these tools: concrete,
self-contained (all needed values given in the task), solvable with the tools, and checkable. Vary them:
single-tool and multi-step tasks, different tools and arguments, plain and tricky phrasings, a few edge
cases. Rate each task's difficulty from 1 (one obvious call) to 5 (several dependent calls, careful
reading). Give a reference_answer only when the right answer is fixed and known without running the
tools' side effects (e.g. arithmetic); otherwise null."""


class ScenarioDraft(Schema):
    """One generated task, as the generator writes it."""

    task: str = Field(min_length=8, description="What the user asks, with every value the agent needs.")
    difficulty: int = Field(ge=1, le=5, description="1 = one obvious tool call ... 5 = several dependent calls.")
    reference_answer: str | None = Field(None, description="The correct final answer, when it is fixed and known.")


class Scenario(ScenarioDraft):
    """A saved task with its id and split."""

    id: str
    split: Literal["train", "val"]


def describe_server(tools: list[dict[str, Any]], instructions: str | None, resources: list[Any]) -> str:
    """The server as the generator sees it: instructions, tools with their schemas, resources."""
    parts = [f"Server instructions:\n{instructions.strip()}"] if instructions and instructions.strip() else []
    lines = []
    for tool in tools:
        function = tool["function"]
        schema = json.dumps(function.get("parameters") or {}, sort_keys=True)
        lines.append(
            f"- {function['name']}: {function.get('description') or '(no description)'}\n  arguments: {schema}"
        )
    parts.append("Tools:\n" + "\n".join(lines))
    if resources:
        listed = "\n".join(
            f"- {getattr(r, 'uri', r)}: {getattr(r, 'description', None) or getattr(r, 'name', '')}" for r in resources
        )
        parts.append(f"Resources:\n{listed}")
    return "\n\n".join(parts)


async def generate_scenarios(
    generator_model: str,
    server_description: str,
    count: int,
    *,
    max_attempts: int = 3,
    litellm_params: dict[str, Any] | None = None,
) -> Generated[ScenarioDraft]:
    """`count` distinct tasks for the server described (see `describe_server`)."""
    messages = [
        {"role": "system", "content": SCENARIO_SYSTEM},
        {"role": "user", "content": f"{server_description}\n\nWrite {count} tasks for an agent using these tools."},
    ]
    return await generate_items(
        generator_model,
        messages,
        ScenarioDraft,
        count,
        field="scenarios",
        text_of=lambda s: s.task,
        max_attempts=max_attempts,
        litellm_params=litellm_params,
    )


def split_scenarios(drafts: list[ScenarioDraft], val_count: int, seed: int = 0) -> list[Scenario]:
    """A seeded train/val split; the val tasks are never trained on."""
    if not 0 <= val_count < len(drafts):
        raise ValueError(f"val_count must leave at least one training scenario (got {val_count} of {len(drafts)})")
    order = list(range(len(drafts)))
    random.Random(seed).shuffle(order)
    val = set(order[:val_count])
    return [
        Scenario(id=f"s{index:04d}", split="val" if index in val else "train", **draft.model_dump())
        for index, draft in enumerate(drafts)
    ]

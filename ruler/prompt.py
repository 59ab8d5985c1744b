"""The judge prompt: one message pair that shows a whole group at once.

Rollouts of the same task usually share their opening (system prompt, task, sometimes scripted
turns). That prefix is shown once as context and each trajectory shows only what follows it, so
the judge's prompt grows with what differs, not with the group size times the task length.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from art_agents.messages import ChatMessage, as_messages

DEFAULT_RUBRIC = """\
- A trajectory that achieves its goal should always get a significantly higher score than one that does not.
- A trajectory that achieves its goal more efficiently (fewer steps, fewer wasted tool calls) should get a \
higher score than one that achieves it less efficiently.
- If one trajectory is only slightly better than another, the difference in scores should be small. If it \
is significantly better, the difference should be large.
- You may give some partial credit for a trajectory that makes progress towards its goal but does not \
complete it.
- Judge what the agent did, not how confident it sounds: claims that the tool results contradict count \
against it."""

Messages = Sequence[ChatMessage | dict[str, Any]]
Tools = list[dict[str, Any]] | None


def trajectory_ids(count: int) -> list[str]:
    """Short, stable ids: a small local judge copies `t3` reliably; a UUID it often garbles."""
    return [f"t{index + 1}" for index in range(count)]


def common_prefix_length(message_lists: Sequence[list[ChatMessage]]) -> int:
    """How many leading messages every conversation shares (compared as clients rewrite them)."""
    if not message_lists:
        return 0
    shortest = min(len(messages) for messages in message_lists)
    first = message_lists[0]
    for index in range(shortest):
        if not all(messages[index].same_as(first[index]) for messages in message_lists[1:]):
            return index
    return shortest


def _message_line(message: ChatMessage) -> str:
    """One message as a compact JSON line: what the judge needs, none of the wire noise."""
    line: dict[str, Any] = {"role": message.role}
    if message.name:
        line["name"] = message.name
    if message.role == "tool" and message.tool_call_id:
        line["tool_call_id"] = message.tool_call_id
    text = message.text()
    if text or not message.tool_calls:
        line["content"] = text
    if message.tool_calls:
        line["tool_calls"] = [
            {"id": call.id, "name": call.function.name, "arguments": call.function.arguments}
            for call in message.tool_calls
        ]
    return json.dumps(line, ensure_ascii=False)


def _messages_block(messages: Sequence[ChatMessage]) -> str:
    return "\n".join(_message_line(message) for message in messages)


def _tools_block(tools: list[dict[str, Any]]) -> str:
    return "<tools>\n" + "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools) + "\n</tools>"


def system_prompt(rubric: str) -> str:
    return (
        "You are an impartial judge. You will see several trajectories of an AI agent attempting the same task. "
        "Score each one from 0 to 1 relative to the others, following the rubric.\n\n"
        f"Rubric:\n{rubric}\n\n"
        'Answer with JSON only: {"scores": [{"trajectory_id": "...", "explanation": "...", "score": 0.0}]}, '
        "with exactly one entry per trajectory id shown, each score a number between 0 and 1 inclusive."
    )


def render_judge_messages(
    message_lists: Sequence[Messages],
    ids: Sequence[str],
    rubric: str,
    *,
    tools: Sequence[Tools] | None = None,
    order: Sequence[int] | None = None,
    dedup_prefix: bool = True,
) -> list[dict[str, str]]:
    """The judge's messages for a group, trajectories shown in `order` (indices into `message_lists`).

    Tools identical across the group are shown once with the context, otherwise per trajectory.
    `dedup_prefix=False` shows every conversation in full, tools included (the benchmark's baseline).
    """
    if len(ids) != len(message_lists):
        raise ValueError(f"got {len(ids)} ids for {len(message_lists)} conversations; give one id per conversation")
    lists = [as_messages(list(messages)) for messages in message_lists]
    tool_lists: list[Tools] = list(tools) if tools is not None else [None] * len(lists)
    if len(tool_lists) != len(lists):
        raise ValueError(f"got {len(tool_lists)} tool lists for {len(lists)} conversations; give one per conversation")
    order = list(order) if order is not None else list(range(len(lists)))
    prefix = common_prefix_length(lists) if dedup_prefix and len(lists) > 1 else 0
    shared_tools = dedup_prefix and all(t == tool_lists[0] for t in tool_lists)

    parts: list[str] = []
    if prefix or (shared_tools and tool_lists and tool_lists[0]):
        parts.append("Context shared by every trajectory (each trajectory below continues it):")
        if shared_tools and tool_lists and tool_lists[0]:
            parts.append("Tools available to the agent:\n" + _tools_block(tool_lists[0]))
        if prefix:
            parts.append("<context>\n" + _messages_block(lists[0][:prefix]) + "\n</context>")
    parts.append("Trajectories to score:")
    for index in order:
        body = _messages_block(lists[index][prefix:])
        own_tools = tool_lists[index]
        if not shared_tools and own_tools:
            body = _tools_block(own_tools) + "\n" + body
        parts.append(f'<trajectory id="{ids[index]}">\n{body}\n</trajectory>')
    shown = ", ".join(ids[index] for index in order)
    parts.append(f"Score every trajectory: {shown}.")
    return [{"role": "system", "content": system_prompt(rubric)}, {"role": "user", "content": "\n\n".join(parts)}]


def response_format(ids: Sequence[str]) -> dict[str, Any]:
    """JSON schema answer format; engines with guided decoding (vLLM, OpenAI) then cannot stray."""
    entry = {
        "type": "object",
        "properties": {
            "trajectory_id": {"type": "string", "enum": list(ids)},
            "explanation": {"type": "string"},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["trajectory_id", "explanation", "score"],
        "additionalProperties": False,
    }
    schema = {
        "type": "object",
        "properties": {"scores": {"type": "array", "items": entry, "minItems": len(ids), "maxItems": len(ids)}},
        "required": ["scores"],
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": "ruler_scores", "schema": schema, "strict": True}}

"""A ready rollout for tool use: the model works on a task with an MCP server's tools.

The model sees the server's tools plus `complete_task(answer)`, and runs for at most `max_turns`
model calls; tool calls are executed on the MCP server (and recorded by the session), and the
rollout ends when the model calls `complete_task`, answers without a tool call, or runs out of turns.
The same code runs a `TrainableModel` and a prompted baseline `Model` (any OpenAI-compatible
endpoint), so both are measured the same way.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import Field

from art_agents.capture import record_tool_result, rollout
from art_agents.schema import Schema
from art_agents.trajectory import Trajectory

if TYPE_CHECKING:
    from art_agents.autorl.scenarios import Scenario
    from art_agents.integrations.mcp import MCPServer, MCPSession
    from art_agents.model import Model

COMPLETE_TASK = "complete_task"
COMPLETE_TASK_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": COMPLETE_TASK,
        "description": "Call this once the task is done, with the final answer for the user.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The final answer."}},
            "required": ["answer"],
        },
    },
}
DEFAULT_SYSTEM = (
    "You are an assistant that solves the user's task with the tools of the '{server}' MCP server. Call tools "
    "as needed, one step at a time, and use their results. When you are done, call complete_task with the "
    "final answer."
)


class ToolRolloutConfig(Schema):
    """How the tool-use rollout talks to the model."""

    max_turns: int = Field(6, ge=1, description="Model calls per rollout before it counts as out of turns.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature of the rollouts.")
    max_tokens: int = Field(256, ge=1, description="Completion budget of each model call.")
    system_prompt: str | None = Field(
        None, description="Replaces the default system prompt; `{server}` is the server's name."
    )
    examples: list[dict[str, Any]] = Field(
        default_factory=list,
        description=(
            "Worked examples as OpenAI messages (user, assistant with tool_calls, tool, ...), placed between the "
            "system prompt and the task: few-shot demonstrations that small models follow better than instructions. "
            "Their assistant messages are marked `weight` 0 in the trajectory, so `train_sft` on it trains only the "
            "rollout's own replies (a `weight` key given here is never sent to the model's endpoint)."
        ),
    )


def system_prompt(session: MCPSession, config: ToolRolloutConfig) -> str:
    prompt = (config.system_prompt or DEFAULT_SYSTEM).replace("{server}", session.server_name)
    if session.instructions and session.instructions.strip():
        prompt += f"\n\nAbout this server: {session.instructions.strip()}"
    return prompt


def _answer_of(arguments: str) -> str:
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments
    return str(parsed.get("answer", "")) if isinstance(parsed, dict) else str(parsed)


def _mark_examples(trajectory: Trajectory, count: int) -> None:
    """The worked examples (after the system prompt) are prompt, not this rollout's work: `"weight": 0` keeps
    `train_sft` from imitating them again in every demonstration. Marked after the last call, since the capture
    rebuilds the messages from each request and chat endpoints refuse the key."""
    for message in trajectory.messages[1 : 1 + count]:
        if message.role == "assistant":
            message.weight = 0


async def tool_rollout(
    model: Model, scenario: Scenario, session: MCPSession, config: ToolRolloutConfig | None = None
) -> Trajectory:
    """One attempt at `scenario`; the trajectory's metadata holds the answer, metrics the tool use."""
    config = config or ToolRolloutConfig()
    tools = [*session.openai_tools(), COMPLETE_TASK_TOOL]
    client = model.openai_client()
    metrics = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "malformed_tool_calls": 0}
    completed = False
    answer: str | None = None
    try:
        async with rollout(scenario_id=scenario.id, task=scenario.task) as trajectory:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": system_prompt(session, config)},
                *({k: v for k, v in m.items() if k != "weight"} for m in config.examples),  # endpoints refuse it
                {"role": "user", "content": scenario.task},
            ]
            while metrics["turns"] < config.max_turns and not completed:
                response = await client.chat.completions.create(
                    model=model.served_name,
                    messages=messages,  # type: ignore[arg-type]
                    tools=tools,  # type: ignore[arg-type]
                    temperature=config.temperature,
                    max_tokens=config.max_tokens,
                )
                metrics["turns"] += 1
                message = response.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                calls = message.tool_calls or []
                if not calls:
                    if "<tool_call>" in (message.content or ""):
                        metrics["malformed_tool_calls"] += 1  # the server could not parse it: kept as text
                    answer = message.content or ""
                    break
                for call in calls:
                    if call.function.name == COMPLETE_TASK:
                        completed, answer = True, _answer_of(call.function.arguments)
                        tool_message = {"role": "tool", "tool_call_id": call.id, "content": "Task complete."}
                    else:
                        result = await session.call_tool(
                            call.function.name, call.function.arguments, tool_call_id=call.id
                        )
                        metrics["tool_calls"] += 1
                        metrics["tool_errors"] += int(result.is_error)
                        tool_message = result.message(call.id)
                    messages.append(tool_message)
                    # a result the model never gets to read (last turn) still belongs in the trajectory
                    record_tool_result(call.id, tool_message["content"], name=call.function.name)
            _mark_examples(trajectory, len(config.examples))
            trajectory.metadata["answer"] = answer
            trajectory.metrics.update(metrics)
            trajectory.metrics["completed"] = completed
            trajectory.metrics["ran_out_of_turns"] = not completed and answer is None
            trajectory.metrics["temperature"] = config.temperature  # what was sampled at, when it adapts
    finally:
        await client.close()
    return trajectory


async def server_rollout(
    model: Model, scenario: Scenario, server: MCPServer, config: ToolRolloutConfig | None = None
) -> Trajectory:
    """`tool_rollout` in a session of its own (or the shared one), closed when the rollout ends."""
    async with server.session() as session:
        return await tool_rollout(model, scenario, session, config)

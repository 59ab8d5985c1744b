"""benchmarks/mcp_rl.py's rollouts: the tool rollout, the reward that checks the answer, and the
scripted teacher that knows every task's solution."""

from __future__ import annotations

import json
import re
from typing import Any

from mcp_tasks import Solved

from art_agents.autorl.scenarios import Scenario
from art_agents.autorl.tool_rollout import ToolRolloutConfig
from art_agents.autorl.tool_rollout import server_rollout as library_rollout

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def correct(reference: str, answer: str | None) -> bool:
    """The answer holds exactly one number and it is the reference (commas ignored; 1e-3 for the divisions'
    decimals). One number, not the first: RL after SFT learned to answer "(39324) * 87", whose first number was
    right, and drifted from there to answers whose first number was not (`benchmarks/mcp_rl_log.md`)."""
    found = NUMBER.findall(answer or "")
    if len(found) != 1:
        return False
    return abs(float(found[0].replace(",", "")) - float(reference)) <= 1e-3


def reward(scenario: Scenario, trajectory: Any, *, shaping: bool = True) -> float:
    """1 for the right final answer; else a ladder toward it (`--no-shaping`: 0).

    SmolLM2-135M almost never answers these right at first (1 of 32 samples), so a pass/fail reward gives
    GRPO nothing to compare. The ladder pays 0.3 for a tool call that ran and returned a value, 0.2 for one
    that ran and found nothing (`[]`, or only NULLs: a SUM over no rows), 0.1 for any parseable tool call
    (one the server refused counts as that: see `server_rollout`); task success is still measured pass/fail.
    """
    if correct(scenario.reference_answer or "", trajectory.metadata.get("answer")):
        return 1.0
    if not shaping:
        return 0.0
    calls, errors = trajectory.metrics.get("tool_calls", 0), trajectory.metrics.get("tool_errors", 0)
    if calls:
        if calls == errors:
            return 0.1
        return 0.2 if trajectory.metrics.get("empty_results", 0) == calls - errors else 0.3
    return 0.05 if trajectory.metrics.get("malformed_tool_calls", 0) else 0.0


SERVER_ERROR = re.compile(r"(Database error|Error): ")
EMPTY_RESULT = re.compile(r"\[\]|\[(\{'[^']*': None\}(, )?)+\]")


async def server_rollout(model: Any, scenario: Scenario, server: Any, config: ToolRolloutConfig) -> Any:
    """The library's `server_rollout`, then the server's own error messages counted as errors.

    `mcp-server-sqlite` answers a query that fails (`no such column`, a syntax error, a write) with a plain text
    result, `Database error: ...` or `Error: ...`, not with MCP's `isError`, so the client records a call that
    ran. Such calls are added to `tool_errors` here (so the reward's ladder and the valid-tool-call rate see them),
    and results that hold no value (`[]`, `[{'SUM(quantity)': None}]`) are counted in `empty_results`. The
    calculator flags its errors itself, so nothing changes for it.
    """
    trajectory = await library_rollout(model, scenario, server, config)
    ran = [call for call in trajectory.tool_calls if call.error is None]
    refused = sum(bool(SERVER_ERROR.match(call.result or "")) for call in ran)
    trajectory.metrics["tool_errors"] = trajectory.metrics.get("tool_errors", 0) + refused
    trajectory.metrics["server_error_results"] = refused
    trajectory.metrics["empty_results"] = sum(bool(EMPTY_RESULT.fullmatch((c.result or "").strip())) for c in ran)
    return trajectory


class Teacher:
    """A scripted OpenAI-compatible endpoint on loopback that solves every task the right way: the tool call that
    answers it, then `complete_task` with the number the tool returned. It stands in for a frontier model
    as the SFT warmup's teacher (none is reachable offline); the student only ever sees its rollouts."""

    def __init__(self, tasks: list[Solved]) -> None:
        from scripted_openai import ScriptedOpenAI

        self.solutions = {task.scenario.task: task for task in tasks}
        self.endpoint = ScriptedOpenAI()
        self.endpoint.default = self.reply

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        asked = max(i for i, m in enumerate(messages) if m["role"] == "user")
        solved = next(t for task, t in self.solutions.items() if task in messages[asked]["content"])
        results = [m["content"] for m in messages[asked + 1 :] if m["role"] == "tool"]
        if results:  # the number the tool returned
            name, arguments = "complete_task", {"answer": (NUMBER.findall(results[-1]) or [results[-1]])[0]}
        else:
            name, arguments = solved.tool, solved.arguments
        call = {"id": f"call{len(messages)}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    def __enter__(self) -> Any:
        from art_agents import Model

        self.endpoint.__enter__()
        return Model(name="teacher", inference_base_url=self.endpoint.base_url, inference_api_key="unused")

    def __exit__(self, *exc: object) -> None:
        self.endpoint.__exit__(*exc)

"""The ready MCP•RL rollout, driven by a prompted baseline `Model` on a scripted OpenAI endpoint.

The model's tool calls run on our real key-value MCP server over stdio; the rollout records the
model turns and tool calls in order, sends the results back, and stops on `complete_task`, on a
plain answer, or when it runs out of turns.
"""

from __future__ import annotations

import json
from typing import Any

from mcp_fixtures import kv_server
from scripted_openai import ScriptedOpenAI

from art_agents import Model, ToolCallRecord, Turn
from art_agents.autorl.scenarios import Scenario
from art_agents.autorl.tool_rollout import ToolRolloutConfig, tool_rollout

SCENARIO = Scenario(id="s0001", split="train", task="Store Paris under 'city', read it back, report it.", difficulty=2)


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"content": None, "tool_calls": [{"id": call_id, "type": "function", "function": function}]}


def baseline(server: ScriptedOpenAI) -> Model:
    return Model(name="gpt-4.1", inference_base_url=server.base_url, inference_api_key="sk-test")


async def test_a_baseline_uses_the_tools_and_completes_the_task(scripted: ScriptedOpenAI) -> None:
    scripted.replies = [
        call("c1", "put", key="city", value="Paris"),
        call("c2", "get", key="city"),
        call("c3", "complete_task", answer="Paris"),
    ]
    async with kv_server().session() as session:
        trajectory = await tool_rollout(baseline(scripted), SCENARIO, session)

    assert trajectory.metadata["answer"] == "Paris" and trajectory.metadata["scenario_id"] == "s0001"
    metrics = trajectory.metrics
    assert metrics["turns"] == 3 and metrics["tool_calls"] == 2 and metrics["tool_errors"] == 0
    assert metrics["completed"] is True and metrics["ran_out_of_turns"] is False
    assert [type(e) for e in trajectory.timeline()] == [Turn, ToolCallRecord, Turn, ToolCallRecord, Turn]
    assert [c.name for c in trajectory.tool_calls] == ["put", "get"] and trajectory.tool_calls[1].result == "Paris"
    sent_tools = {t["function"]["name"] for t in scripted.requests[0]["tools"]}
    assert {"put", "get", "keys", "complete_task"} <= sent_tools
    last = scripted.requests[2]["messages"]
    assert last[0]["role"] == "system" and "kv" in last[0]["content"]
    assert last[-1] == {"role": "tool", "tool_call_id": "c2", "content": "Paris"}  # the model saw the real result
    assert trajectory.messages[-1].role == "tool" and trajectory.messages[-1].tool_call_id == "c3"


async def test_errors_and_running_out_of_turns_are_counted(scripted: ScriptedOpenAI) -> None:
    scripted.default = lambda body: call(f"c{len(body['messages'])}", "no_such_tool", x=1)
    async with kv_server().session() as session:
        trajectory = await tool_rollout(baseline(scripted), SCENARIO, session, ToolRolloutConfig(max_turns=2))
    metrics = trajectory.metrics
    assert metrics["turns"] == 2 and metrics["tool_calls"] == 2 and metrics["tool_errors"] == 2
    assert metrics["completed"] is False and metrics["ran_out_of_turns"] is True
    assert trajectory.metadata["answer"] is None
    assert scripted.requests[1]["messages"][-1]["content"].startswith("Error: ")


async def test_a_plain_answer_ends_the_rollout_and_few_shot_examples_come_first(scripted: ScriptedOpenAI) -> None:
    scripted.replies = ["It is Paris."]
    examples = [  # the second marked already, as a user copying a fine-tuning file might
        *({"role": "user", "content": "Example task"}, {"role": "assistant", "content": "Example answer"}),
        *({"role": "user", "content": "Task 2"}, {"role": "assistant", "content": "Answer 2", "weight": 0}),
    ]
    config = ToolRolloutConfig(examples=examples, system_prompt="Use the {server} tools.", temperature=0.3)
    async with kv_server().session() as session:
        trajectory = await tool_rollout(baseline(scripted), SCENARIO, session, config)
    assert trajectory.metadata["answer"] == "It is Paris." and trajectory.metrics["completed"] is False
    assert trajectory.metrics["ran_out_of_turns"] is False
    request = scripted.requests[0]
    contents = ["Example task", "Example answer", "Task 2", "Answer 2", SCENARIO.task]
    assert [m["content"] for m in request["messages"][1:]] == contents
    assert request["messages"][0]["content"].startswith("Use the kv tools.") and request["temperature"] == 0.3
    assert all("weight" not in m for m in request["messages"])  # chat endpoints refuse the fine-tuning key
    # the examples' replies are prompt, marked so that train_sft on this trajectory trains only the rollout's own
    assert [m.weight for m in trajectory.messages if m.role == "assistant"] == [0, 0, None]

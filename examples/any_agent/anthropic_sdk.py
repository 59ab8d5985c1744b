"""An agent written with the Anthropic SDK, trained as it is: only its base URL points at the server.

    python examples/any_agent/anthropic_sdk.py --tiny          # CPU: the random tiny model (learns nothing)
    python examples/any_agent/anthropic_sdk.py --base-model Qwen/Qwen3-0.6B   # a real run, on a GPU

Needs `pip install anthropic` beside the `server` extra.
"""

from __future__ import annotations

from typing import Any

import anthropic
from arithmetic import SYSTEM, add, main, reward

import art_agents as art

TOOLS = [
    {
        "name": "add",
        "description": "Add two integers.",
        "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    }
]


async def rollout(model: art.Model, scenario: dict[str, Any]) -> art.Trajectory:
    base_url, api_key = model.endpoint()
    client = anthropic.AsyncAnthropic(base_url=base_url.removesuffix("/v1"), api_key=api_key)  # the one change
    messages: list[dict[str, Any]] = [{"role": "user", "content": scenario["question"]}]
    async with art.rollout(scenario=scenario["id"]) as trajectory:  # every call inside is captured
        for _ in range(3):
            reply = await client.messages.create(
                model=model.get_inference_name(), system=SYSTEM, messages=messages, tools=TOOLS, max_tokens=256
            )
            messages.append({"role": "assistant", "content": [block.model_dump() for block in reply.content]})
            calls = [block for block in reply.content if block.type == "tool_use"]
            if not calls:
                break
            messages.append({"role": "user", "content": [result_of(call) for call in calls]})
        answer = "".join(block.text for block in reply.content if block.type == "text")
        trajectory.reward = reward(answer, scenario)
    await client.close()
    return trajectory


def result_of(call: Any) -> dict[str, Any]:
    try:
        content, error = str(add(int(call.input["a"]), int(call.input["b"]))), False
    except (KeyError, TypeError, ValueError) as exc:
        content, error = f"bad arguments: {exc}", True
    return {"type": "tool_result", "tool_use_id": call.id, "content": content, "is_error": error}


if __name__ == "__main__":
    main(rollout, "anthropic-adder", __doc__.split("\n\n")[0])

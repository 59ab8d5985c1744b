"""An agent written with the OpenAI Agents SDK, trained as it is: only its client points at the server.

    python examples/any_agent/openai_agents_sdk.py --tiny      # CPU: the random tiny model (learns nothing)
    python examples/any_agent/openai_agents_sdk.py --base-model Qwen/Qwen3-0.6B   # a real run, on a GPU

Needs `pip install openai-agents` beside the `server` extra. The agent speaks the Responses API
(`OpenAIResponsesModel`); `OpenAIChatCompletionsModel` works the same way.
"""

from __future__ import annotations

import contextlib
from typing import Any

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from arithmetic import SYSTEM, add, main, reward
from openai import AsyncOpenAI

import art_agents as art

set_tracing_disabled(True)  # traces go to OpenAI's servers otherwise


async def rollout(model: art.Model, scenario: dict[str, Any]) -> art.Trajectory:
    base_url, api_key = model.endpoint()
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)  # the one change
    agent = Agent(
        name="adder",
        instructions=SYSTEM,
        tools=[function_tool(add)],
        model=OpenAIResponsesModel(model=model.get_inference_name(), openai_client=client),
    )
    async with art.rollout(scenario=scenario["id"]) as trajectory:  # every call inside is captured
        # still calling tools after 3 turns, or a reply cut at its token limit: scored on what it said last
        with contextlib.suppress(MaxTurnsExceeded, ModelBehaviorError):
            await Runner.run(agent, scenario["question"], max_turns=3)
    await client.close()
    trajectory.reward = reward(trajectory.messages[-1].text() if trajectory.messages else None, scenario)
    return trajectory


if __name__ == "__main__":
    main(rollout, "agents-sdk-adder", __doc__.split("\n\n")[0])

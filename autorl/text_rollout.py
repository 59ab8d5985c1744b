"""AutoRL's rollout: the model answers one input under the task's system prompt, in one model call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from art_agents.capture import rollout
from art_agents.schema import Schema
from art_agents.trajectory import Trajectory

if TYPE_CHECKING:
    from art_agents.autorl.task_data import TaskInput
    from art_agents.model import Model


class TextRolloutConfig(Schema):
    """How the AutoRL rollout samples its answer."""

    temperature: float = Field(1.0, ge=0, description="Sampling temperature of training rollouts.")
    max_tokens: int = Field(256, ge=1, description="Completion budget of an answer; longer answers are cut off.")


async def text_rollout(
    model: Model, item: TaskInput, system_prompt: str, config: TextRolloutConfig | None = None
) -> Trajectory:
    """One answer to `item`; metadata holds the answer, `metrics["completed"]` is False when it was cut off."""
    config = config or TextRolloutConfig()
    client = model.openai_client()
    try:
        async with rollout(scenario_id=item.id, task=item.input) as trajectory:
            response = await client.chat.completions.create(
                model=model.served_name,
                messages=[{"role": "system", "content": system_prompt}, {"role": "user", "content": item.input}],
                temperature=config.temperature,
                max_tokens=config.max_tokens,
            )
            choice = response.choices[0]
            trajectory.metadata["answer"] = choice.message.content or ""
            trajectory.metrics["completed"] = choice.finish_reason != "length"
            trajectory.metrics["completion_tokens"] = response.usage.completion_tokens if response.usage else 0
    finally:
        await client.close()
    return trajectory

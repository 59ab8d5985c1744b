"""AutoRL's data, invented from a plain task description: a system prompt, a rubric, and inputs.

The generator writes the system prompt the trained model will run under and the rubric the judge
will grade by (both saved as editable markdown in the run folder), then inputs: realistic requests
of varied length, difficulty and edge cases. Inputs are checked and deduplicated by the shared
generation code, and later rounds can be steered toward what the model still fails at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from art_agents.autorl.generation import Generated, GenerationError, generate_items
from art_agents.llm import Answer, CannotCall, NoValidAnswer, ask_for_object
from art_agents.schema import Schema

SETUP_SYSTEM = """You prepare reinforcement-learning training for a small language model. From a description
of the task the model must learn, write:
- system_prompt: the system prompt the model will run under. Address the model directly, say what to do
  and what a good answer looks like (format, length, tone), in at most 150 words.
- rubric: how a judge should grade answers, as a short list of concrete criteria in order of importance,
  drawn from the description: what makes an answer correct, what is a serious error, what is a minor one.
Answer with JSON only: {"system_prompt": "...", "rubric": "..."}."""

INPUTS_SYSTEM = """You write inputs for training a small language model on a task. Each input is one request a
real user would send, exactly as they would write it (the model sees nothing else besides its system
prompt). Make them diverse and realistic: short and long, easy and hard, typical cases and edge cases
(ambiguous, unusual, tricky), different topics and styles. Rate each input's difficulty from 1 (easy) to 5
(hard)."""


class TaskSetup(Schema):
    """The generated system prompt and rubric of a task."""

    system_prompt: str = Field(min_length=20, description="The trained model's system prompt.")
    rubric: str = Field(min_length=20, description="How the judge grades answers.")


class InputDraft(Schema):
    """One generated input, as the generator writes it."""

    input: str = Field(min_length=1, description="The user's request, exactly as sent to the model.")
    difficulty: int = Field(ge=1, le=5, description="1 = easy ... 5 = hard.")


class TaskInput(InputDraft):
    """A saved input with its id and the step at which it joined the pool (0 = before training)."""

    id: str
    added_at_step: int = 0


async def generate_setup(
    generator_model: str, description: str, *, max_attempts: int = 3, litellm_params: dict[str, Any] | None = None
) -> Answer[TaskSetup]:
    """The system prompt and rubric for the task `description`."""
    messages = [
        {"role": "system", "content": SETUP_SYSTEM},
        {"role": "user", "content": f"The task:\n{description.strip()}"},
    ]
    try:
        return await ask_for_object(
            generator_model,
            messages,
            TaskSetup,
            schema_name="task_setup",
            example='{"system_prompt": "...", "rubric": "..."}, both non-empty.',
            max_attempts=max_attempts,
            litellm_params=litellm_params,
        )
    except (CannotCall, NoValidAnswer) as exc:
        raise GenerationError.of(exc) from exc


async def generate_inputs(
    generator_model: str,
    description: str,
    count: int,
    *,
    existing: Sequence[str] = (),
    focus: str | None = None,
    max_attempts: int = 3,
    litellm_params: dict[str, Any] | None = None,
) -> Generated[InputDraft]:
    """`count` distinct inputs for the task, none a near-duplicate of `existing`.

    `focus` steers the batch (the curriculum says what the model still fails at).
    """
    request = f"The task:\n{description.strip()}\n\nWrite {count} inputs for it."
    if focus:
        request += f"\n\n{focus}"
    return await generate_items(
        generator_model,
        [{"role": "system", "content": INPUTS_SYSTEM}, {"role": "user", "content": request}],
        InputDraft,
        count,
        field="inputs",
        text_of=lambda item: item.input,
        existing=existing,
        max_attempts=max_attempts,
        litellm_params=litellm_params,
    )


def number_inputs(drafts: Sequence[InputDraft], prefix: str, start: int, step: int = 0) -> list[TaskInput]:
    """Saved inputs with ids `prefix` + a running number from `start` (ids are never reused)."""
    return [
        TaskInput(id=f"{prefix}{start + index:04d}", added_at_step=step, **draft.model_dump())
        for index, draft in enumerate(drafts)
    ]

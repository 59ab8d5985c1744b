"""Pairwise judging: which of two answers to the same request is better, by a rubric.

AutoRL's win rate of the trained model against the base model on held-out inputs. The judge sees
the two answers in the order the caller chooses (shuffled per input, so a judge that prefers the
first answer cannot favour either model), and may call a tie.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from art_agents.llm import (
    DEFAULT_BACKOFF,
    Backoff,
    CallTotals,
    CannotCall,
    LLMCall,
    NoValidAnswer,
    ask_for_object,
)
from art_agents.ruler.judge import RulerError

Outcome = Literal["win", "loss", "tie"]

PAIRWISE_SYSTEM = """You compare two answers an AI assistant gave to the same request, and say which is
better by the rubric. Judge the content, not the position or the length of an answer. Say "tie" only
when neither answer is better. Answer with JSON only:
{"explanation": "<one or two sentences>", "better": "1" | "2" | "tie"}"""
VERDICT_FORMAT = '{"explanation": "...", "better": "1" | "2" | "tie"}'


class PairVerdict(BaseModel):
    explanation: str = ""
    better: Literal["1", "2", "tie"]

    @field_validator("better", mode="before")
    @classmethod
    def _plain(cls, value: Any) -> Any:
        text = str(value).strip().lower().removeprefix("answer").strip()
        return text if text in ("1", "2") else "tie" if text in ("tie", "0", "neither") else value


class PairJudgement(CallTotals, BaseModel):
    """The candidate's outcome against the baseline, the judge's reason, and what it cost."""

    outcome: Outcome
    explanation: str
    swapped: bool = Field(description="True when the judge saw the baseline's answer first.")
    calls: list[LLMCall]


def render_pair(request: str, first: str, second: str, rubric: str, instructions: str | None = None) -> str:
    parts = [f"Rubric:\n{rubric.strip()}"]
    if instructions:
        parts.append(f"The assistant's instructions (system prompt):\n{instructions.strip()}")
    parts += [f"The request:\n{request.strip()}", f"Answer 1:\n{first.strip()}", f"Answer 2:\n{second.strip()}"]
    return "\n\n".join(parts)


async def compare_answers(
    judge_model: str,
    request: str,
    candidate: str,
    baseline: str,
    rubric: str,
    *,
    instructions: str | None = None,
    swap: bool = False,
    max_attempts: int = 3,
    backoff: Backoff = DEFAULT_BACKOFF,
    **litellm_params: Any,
) -> PairJudgement:
    """Judge `candidate` against `baseline` for `request`; `swap=True` shows the baseline first."""
    first, second = (baseline, candidate) if swap else (candidate, baseline)
    messages = [
        {"role": "system", "content": PAIRWISE_SYSTEM},
        {"role": "user", "content": render_pair(request, first, second, rubric, instructions)},
    ]
    try:
        answer = await ask_for_object(
            judge_model,
            messages,
            PairVerdict,
            schema_name="pair_verdict",
            example=VERDICT_FORMAT,
            max_attempts=max_attempts,
            litellm_params=litellm_params,
            backoff=backoff,
        )
    except (CannotCall, NoValidAnswer) as exc:
        raise RulerError.of(exc) from exc
    better = answer.value.better
    candidate_slot = "2" if swap else "1"
    outcome: Outcome = "tie" if better == "tie" else "win" if better == candidate_slot else "loss"
    return PairJudgement(outcome=outcome, explanation=answer.value.explanation, swapped=swap, calls=answer.calls)

"""Structured generation through LiteLLM: exactly N valid, distinct items, or a clear error.

AutoRL (inputs from a description) and MCP•RL (tasks from a server's tools) both ask a generator
model for a list of typed items. Generators miscount, wrap JSON in prose, break the schema and
repeat themselves; each answer is validated with pydantic, a bad one is shown back with the problem
named (bounded attempts), near-duplicates are dropped, and the shortfall is asked for again in a
new round that lists what already exists, until the count is exact.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from difflib import SequenceMatcher
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field, ValidationError

from art_agents.errors import ArtError
from art_agents.llm import (
    CallTotals,
    CannotCall,
    InvalidAnswer,
    KeyProblem,
    LLMCall,
    NoValidAnswer,
    ask_until_valid,
    load_json,
    validation_problems,
)

Item = TypeVar("Item", bound=BaseModel)
_WORDS = re.compile(r"[a-z0-9]+")
_NUMBERS = re.compile(r"\d+(?:[.,]\d+)*")  # also inside a token: "25C", "v2", "3.5kg"
DEFAULT_SIMILARITY = 0.85


class GenerationError(ArtError):
    """The generator could not produce the requested items; the message names why and the fix.

    `calls` are the requests it made before giving up: they were paid for all the same.
    """

    def __init__(self, message: str, calls: Sequence[LLMCall] = ()) -> None:
        super().__init__(message)
        self.calls = list(calls)

    def saved(self, what: str) -> GenerationError:
        """This error ending with what the run folder holds (`RunFolder.saved`), for a run that stops here."""
        return GenerationError(f"{self}; {what}", self.calls)

    @classmethod
    def of(cls, exc: CannotCall | NoValidAnswer, earlier: Sequence[LLMCall] = ()) -> GenerationError:
        """The error for a generator request that failed, with the fix for its kind of failure."""
        if isinstance(exc, KeyProblem):  # names the key and how to pass one
            return cls(f"generator {exc}", earlier)
        if isinstance(exc, CannotCall):
            return cls(
                f"generator {exc}. Check --generator-model (any LiteLLM model string, e.g. 'openai/gpt-4.1-mini'), "
                "its api_base and api_key",
                earlier,
            )
        fix = (
            "Check that the generator is running and its api_base, or give it more time (`timeout` in "
            "generator_params: a [generator_params] table in --config)"
            if exc.unreachable
            else "Use a stronger generator model or raise max_attempts"
        )
        return cls(f"generator {exc}. {fix}", [*earlier, *exc.calls])


class Generated(CallTotals, BaseModel, Generic[Item]):
    items: list[Item]
    calls: list[LLMCall] = Field(default_factory=list)
    duplicates_dropped: int = 0


class Generation(BaseModel):
    """What generating a run's data has cost so far (saved beside the data, added to as more is written)."""

    generator_model: str
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = Field(True, description="False once a call's model was missing from LiteLLM's price map.")
    duplicates_dropped: int = 0

    def plus(self, calls: Sequence[LLMCall], duplicates_dropped: int = 0) -> Generation:
        return self.model_copy(
            update={
                "calls": self.calls + len(calls),
                "prompt_tokens": self.prompt_tokens + sum(c.prompt_tokens for c in calls),
                "completion_tokens": self.completion_tokens + sum(c.completion_tokens for c in calls),
                "cost_usd": self.cost_usd + sum(c.cost_usd for c in calls),
                "cost_known": self.cost_known and all(c.cost_known for c in calls),
                "duplicates_dropped": self.duplicates_dropped + duplicates_dropped,
            }
        )


def spend_text(who: str, prompt_tokens: int, completion_tokens: int, cost_usd: float, cost_known: bool) -> str:
    """`who`'s tokens and price as LiteLLM reported them; a price it does not know is said to be unknown."""
    price = f"${cost_usd:.4f}" if cost_known else "cost unknown (model not in LiteLLM's price map)"
    return f"{who}: {prompt_tokens} prompt + {completion_tokens} completion tokens, {price}"


def words(text: str) -> list[str]:
    return _WORDS.findall(text.lower())


def near_duplicate(a: str, b: str, threshold: float = DEFAULT_SIMILARITY) -> bool:
    """Nearly the same words in the same order, and the same numbers.

    Case, punctuation and a word or two of padding are ignored; tasks that differ in their values
    ("12 * 7" and "12 * 9", "25C" and "95C") are different tasks.
    """
    if _NUMBERS.findall(a) != _NUMBERS.findall(b):
        return False
    left, right = words(a), words(b)
    return left == right or SequenceMatcher(None, left, right, autojunk=False).ratio() >= threshold


def response_format(item_type: type[BaseModel], field: str) -> dict[str, Any]:
    """The JSON schema the generator is asked to follow: `{field: [item, ...]}`."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": f"{field}_list",
            "schema": {
                "type": "object",
                "properties": {field: {"type": "array", "items": item_type.model_json_schema()}},
                "required": [field],
            },
        },
    }


def parse_items(text: str | None, item_type: type[Item], field: str, count: int) -> list[Item]:
    """At least `count` valid items under `field` (the first `count` are kept), or InvalidAnswer."""
    if not text or not text.strip():
        raise InvalidAnswer("the answer was empty")
    data = load_json(text)
    entries = data.get(field) if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise InvalidAnswer(f'the answer must be a JSON object {{"{field}": [...]}} holding a list')
    items: list[Item] = []
    problems: list[str] = []
    for position, entry in enumerate(entries[:count]):
        try:
            items.append(item_type.model_validate(entry))
        except ValidationError as exc:
            problems.append(f"{field}[{position}] is invalid ({validation_problems(exc, 'item')})")
    if problems:
        raise InvalidAnswer("; ".join(problems))
    if len(items) < count:
        raise InvalidAnswer(f"the answer holds {len(items)} items under {field!r}, but exactly {count} were asked for")
    return items


async def generate_items(
    generator_model: str,
    messages: list[dict[str, str]],
    item_type: type[Item],
    count: int,
    *,
    field: str = "items",
    text_of: Callable[[Item], str] = str,
    existing: Sequence[str] = (),
    similarity: float = DEFAULT_SIMILARITY,
    max_attempts: int = 3,
    max_rounds: int = 4,
    litellm_params: dict[str, Any] | None = None,
) -> Generated[Item]:
    """Exactly `count` items that validate as `item_type` and are not near-duplicates.

    `messages` describe what to write; this adds how many and, in later rounds, what exists.
    `text_of(item)` is the text compared for near-duplicates (also against `existing`). Each
    round is one conversation of at most `max_attempts` requests.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    kept: list[Item] = []
    seen = list(existing)
    calls: list[LLMCall] = []
    dropped = 0
    for _ in range(max_rounds):
        needed = count - len(kept)
        request = [*messages, {"role": "user", "content": ask_for(needed, field, seen)}]
        try:
            answer = await ask_until_valid(
                generator_model,
                request,
                lambda text, n=needed: parse_items(text, item_type, field, n),
                lambda problem, n=needed: _reask(problem, n, field),
                max_attempts=max_attempts,
                response_format=response_format(item_type, field),
                litellm_params=litellm_params,
            )
        except (CannotCall, NoValidAnswer) as exc:
            raise GenerationError.of(exc, calls) from exc
        calls += answer.calls
        for item in answer.value:
            text = text_of(item)
            if any(near_duplicate(text, other, similarity) for other in seen):
                dropped += 1
                continue
            kept.append(item)
            seen.append(text)
        if len(kept) == count:
            return Generated[Item](items=kept, calls=calls, duplicates_dropped=dropped)
    raise GenerationError(
        f"generator {generator_model!r} gave only {len(kept)} distinct items of {count} in {max_rounds} rounds "
        f"({dropped} near-duplicates dropped); ask for fewer, or describe more varied cases",
        calls,
    )


def ask_for(count: int, field: str, seen: Sequence[str]) -> str:
    """The request closing each round: the exact count, and (after the first) what already exists."""
    text = f'Answer with JSON only: an object {{"{field}": [...]}} holding exactly {count} items.'
    if seen:
        listed = "\n".join(f"- {s[:200]}" for s in seen[-50:])
        text += f" These already exist; write different ones, not rephrasings of them:\n{listed}"
    return text


def _reask(problem: str, count: int, field: str) -> str:
    return (
        f'Your answer could not be used: {problem}. Answer again with JSON only: {{"{field}": [...]}} holding '
        f"exactly {count} items that follow the schema."
    )

"""OpenAI chat messages as typed models.

Messages stay in the OpenAI wire shape (users and frameworks already speak it); the model only
adds validation so a bad role or a malformed tool call fails at the boundary, not in training.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from art_agents.schema import Schema

Role = Literal["system", "developer", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "developer", "user", "assistant", "tool")


class ToolCallFunction(Schema):
    name: str
    arguments: str = "{}"

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments_as_json_text(cls, value: Any) -> str:
        # LangChain and some SDKs hand over parsed dicts; the wire format is a JSON string.
        return value if isinstance(value, str) else json.dumps(value)


class ToolCall(Schema):
    model_config = ConfigDict(extra="allow")

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(Schema):
    """One OpenAI-format message; unknown extra keys are kept so nothing a client sent is lost."""

    model_config = ConfigDict(extra="allow")

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = Field(default=None, description="Reasoning text, when a server returns it.")
    weight: Literal[0, 1] | None = Field(
        default=None,
        description="OpenAI's fine-tuning key on assistant messages: 0 keeps the message as context that "
        "`train_sft` does not train (a worked example in the prompt); 1 or absent trains it.",
    )

    @field_validator("role", mode="before")
    @classmethod
    def _known_role(cls, value: Any) -> Any:
        if value not in ROLES:
            raise ValueError(
                f"unknown message role {value!r}; use one of {', '.join(ROLES)} "
                "(LangChain's 'human'/'ai' must be converted to 'user'/'assistant')"
            )
        return value

    @model_validator(mode="after")
    def _weight_on_assistant_only(self) -> ChatMessage:
        if self.weight is not None and self.role != "assistant":
            raise ValueError(
                f"a {self.role} message has 'weight' {self.weight}; only assistant messages carry a training weight "
                "(other messages are never trained): drop the key"
            )
        return self

    def text(self) -> str:
        """The message's text, with multi-part content joined."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part.get("text", "")) for part in self.content if isinstance(part, dict))

    def wire(self) -> dict[str, Any]:
        """The dict an OpenAI-compatible chat server expects: no null fields, and no `weight`, a fine-tuning
        key that chat endpoints refuse (the trajectory's own JSON keeps it)."""
        return self.model_dump(mode="json", exclude_none=True, exclude={"weight"})

    def same_as(self, other: ChatMessage) -> bool:
        """Equality that ignores what clients rewrite freely (null vs empty content, extra keys)."""
        return _comparable(self) == _comparable(other)


def _comparable(message: ChatMessage) -> tuple[Any, ...]:
    calls = tuple((c.function.name, _canonical_json(c.function.arguments)) for c in message.tool_calls or [])
    return (message.role, message.text().strip(), calls, message.tool_call_id if message.role == "tool" else None)


def _canonical_json(text: str) -> str:
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except (json.JSONDecodeError, TypeError):
        return text


def as_messages(messages: list[Any]) -> list[ChatMessage]:
    """Validate a list of dicts or messages, naming the index of the first bad one."""
    out: list[ChatMessage] = []
    for index, message in enumerate(messages):
        if isinstance(message, ChatMessage):
            out.append(message)
            continue
        try:
            out.append(ChatMessage.model_validate(message))
        except ValueError as exc:
            raise ValueError(f"messages[{index}] is not a valid chat message: {exc}") from exc
    return out

"""ART's way of building a trajectory by hand: `messages_and_choices`, with OpenAI `Choice` objects
appended as they come back, and `messages()`.

Here they are views of the same `messages` (and `turns`) the automatic capture fills, so a
trajectory built either way trains the same: an appended `Choice` becomes an assistant message
plus a turn carrying the completion id our server put in the choice, so the server trains on the
tokens it sampled instead of re-tokenizing the message.
"""

from __future__ import annotations

from collections.abc import MutableSequence
from typing import Annotated, Any, Protocol, overload

from pydantic import AfterValidator

from art_agents.messages import ChatMessage, as_messages

# The fields of a returned message that are part of the conversation (an SDK also sends refusal,
# annotations, audio: nulls or empties a chat template has no use for).
MESSAGE_FIELDS = ("role", "content", "tool_calls", "reasoning_content")


class MessageList(list[ChatMessage]):
    """A history's `messages`: a list, and callable like ART's `messages()` for the OpenAI dicts."""

    def __call__(self) -> list[dict[str, Any]]:
        return [message.wire() for message in self]


# The field type of `History.messages`: validated as a list of messages, held as a MessageList.
Messages = Annotated[list[ChatMessage], AfterValidator(MessageList)]


class ChoiceHistory(Protocol):
    """What `MessagesAndChoices` views: a `History` (a Protocol, so this module stays below the trajectory)."""

    messages: list[ChatMessage]

    def add_choice(self, choice: Any) -> Any: ...


def is_choice(item: Any) -> bool:
    """An OpenAI `Choice` (or anything shaped like one): it has a `message` and a `finish_reason`."""
    return not isinstance(item, dict | ChatMessage) and hasattr(item, "message") and hasattr(item, "finish_reason")


def choice_message(choice: Any) -> ChatMessage:
    message = choice.message
    fields = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    return ChatMessage.model_validate({k: v for k, v in fields.items() if k in MESSAGE_FIELDS})


def choice_completion_id(choice: Any) -> str | None:
    """The id our server adds to every choice (the key of its token record); None from other servers."""
    extra = getattr(choice, "model_extra", None) or {}
    value = extra.get("completion_id", getattr(choice, "completion_id", None))
    return value if isinstance(value, str) else None


class MessagesAndChoices(MutableSequence[Any]):
    """ART's `messages_and_choices`: a live view of a history's messages that only grows.

    Append a message dict or a `Choice`; reading gives every message as an OpenAI dict (a choice
    reads back as its assistant message). Rewriting or removing entries is refused: edit
    `messages` for that.
    """

    def __init__(self, history: ChoiceHistory) -> None:
        self._history = history

    def __len__(self) -> int:
        return len(self._history.messages)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [message.wire() for message in self._history.messages[index]]
        return self._history.messages[index].wire()

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError(_ONLY_GROWS)

    def __delitem__(self, index: Any) -> None:
        raise TypeError(_ONLY_GROWS)

    def insert(self, index: int, value: Any) -> None:
        if index < len(self):
            raise TypeError(_ONLY_GROWS)
        if is_choice(value):
            self._history.add_choice(value)
        else:
            self._history.messages.append(as_messages([value])[0])

    def copy(self) -> list[dict[str, Any]]:
        return list(self)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, MutableSequence | list) else NotImplemented

    def __repr__(self) -> str:
        return f"MessagesAndChoices({list(self)!r})"


_ONLY_GROWS = (
    "messages_and_choices only grows (append or extend it); to rewrite or drop messages, edit "
    "`trajectory.messages`, a list of ChatMessage"
)

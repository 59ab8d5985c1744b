"""Trajectories and groups: what one rollout did, and the rollouts compared with each other."""

from __future__ import annotations

import math
import time
import traceback
import uuid
from collections.abc import Awaitable, Generator, Iterable
from typing import Any

from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from art_agents.choices import MessageList, Messages, MessagesAndChoices, choice_completion_id, choice_message
from art_agents.errors import ArtError
from art_agents.fatal import fatal_error
from art_agents.messages import ChatMessage, as_messages
from art_agents.schema import Schema
from art_agents.tasks import close_unstarted, gather_or_cancel

SCHEMA_VERSION = 1


class Turn(Schema):
    """One model call. The request is `histories[history][:index]` and the response is at `index`."""

    history: int = Field(0, description="0 is `messages`; k > 0 is `additional_histories[k - 1]`.")
    index: int = Field(description="Position of the response message in that history.")
    completion_id: str | None = Field(None, description="Id the server answered; the key of its token record.")
    model: str | None = Field(None, description="Model name the server answered, `name@step` for ours.")
    policy_step: int | None = Field(None, description="Checkpoint step that sampled this turn.")
    span: str | None = Field(None, description="Graph node or tool context that made the call.")
    latency_s: float = 0.0
    started_at: float | None = Field(None, description="Wall-clock time the request was sent (unknown for a Choice).")
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


class ToolCallRecord(Schema):
    """One tool executed inside a rollout (an MCP call, say), kept beside the model turns.

    Model turns say what the model asked for; this says what actually ran, how long it took and
    whether it failed, which the messages alone cannot show (a timeout, a dead server).
    """

    name: str = Field(description="The tool's own name (an MCP tool name, not the OpenAI-safe alias).")
    arguments: dict[str, Any] | str = Field(default_factory=dict, description="As sent; a string if not JSON.")
    result: str | None = Field(None, description="The result text given back to the model.")
    error: str | None = Field(
        None, description="Why the call failed (timeout, tool error, dead server); None if it ran."
    )
    duration_s: float = 0.0
    tool_call_id: str | None = Field(None, description="The model's tool call this answers, when there was one.")
    span: str | None = Field(None, description="Where the call came from, e.g. `mcp:<server>/<tool>`.")
    after_turn: int = Field(0, description="Model turns recorded before this call: orders calls among the turns.")
    started_at: float = Field(default_factory=time.time)


class History(Schema):
    """A separate conversation inside one rollout (another agent, another system prompt).

    Built by hand the ART way, `History(messages_and_choices=[...])` takes message dicts and
    `Choice` objects; `messages()` gives the OpenAI dicts (see `art_agents.choices`).
    """

    messages: Messages = Field(default_factory=MessageList)
    tools: list[dict[str, Any]] | None = None
    # turns of choices appended to an additional history: its index is known only inside a trajectory
    _choice_turns: list[Turn] = PrivateAttr(default_factory=list)

    def __init__(self, **data: Any) -> None:
        messages_and_choices: Iterable[Any] | None = data.pop("messages_and_choices", None)
        super().__init__(**data)
        if messages_and_choices is not None:
            self.messages_and_choices.extend(messages_and_choices)

    @field_validator("messages", mode="before")
    @classmethod
    def _validate_messages(cls, value: Any) -> list[ChatMessage]:
        return as_messages(list(value))

    @property
    def messages_and_choices(self) -> MessagesAndChoices:
        return MessagesAndChoices(self)

    def add_choice(self, choice: Any) -> Turn:
        """Append an OpenAI `Choice` as the assistant message, with the turn that trains on its tokens."""
        self.messages.append(choice_message(choice))
        turn = Turn(
            index=len(self.messages) - 1,
            completion_id=choice_completion_id(choice),
            finish_reason=getattr(choice, "finish_reason", None),
        )
        self._record(turn)
        return turn

    def _record(self, turn: Turn) -> None:
        self._choice_turns.append(turn)


class Trajectory(History):
    """One rollout: its main history, any additional ones, every model call, and its reward."""

    model_config = ConfigDict(validate_assignment=True)

    schema_version: int = SCHEMA_VERSION
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    additional_histories: list[History] = Field(default_factory=list)
    turns: list[Turn] = Field(default_factory=list)
    tool_calls: list[ToolCallRecord] = Field(default_factory=list, description="Tools executed, in call order.")
    reward: float = 0.0
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)
    failed: bool = False
    hint: str | None = Field(
        None,
        description=(
            "Privileged context for self-distillation (TrainConfig.self_distill): a reference answer, the tool "
            "result the answer should use, a judge's feedback. The rollout never saw it; the teacher does."
        ),
    )
    started_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    _servers: set[str] = PrivateAttr(default_factory=set)  # servers holding calls to assemble (server_capture)

    @field_validator("reward", mode="before")
    @classmethod
    def _numeric_reward(cls, value: Any) -> Any:
        """A reward sent as text ("0.5", "NaN") is a bug upstream: refused instead of coerced."""
        if isinstance(value, str | bytes):
            raise ValueError(f"reward must be a number, got the string {value!r}; send a finite number such as 0.5")
        return value

    @field_validator("reward")
    @classmethod
    def _finite_reward(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"reward must be a finite number, got {value}; check the reward function for 0/0 or inf")
        return value

    @field_validator("metrics")
    @classmethod
    def _finite_metrics(cls, value: dict[str, float | int | bool]) -> dict[str, float | int | bool]:
        for key, number in value.items():
            if isinstance(number, float) and not math.isfinite(number):
                raise ValueError(f"metric {key!r} is {number}; metrics must be finite numbers")
        return value

    @model_validator(mode="after")
    def _turns_point_at_assistant_messages(self) -> Trajectory:
        for position, turn in enumerate(self.turns):
            messages = self.history_messages(turn.history)
            if not 0 <= turn.index < len(messages) or messages[turn.index].role != "assistant":
                raise ValueError(
                    f"turns[{position}] points at history {turn.history} message {turn.index}, "
                    "which is not an assistant message; turns must reference the response they record"
                )
        return self

    def _record(self, turn: Turn) -> None:
        self.turns.append(turn)

    @model_serializer(mode="wrap")
    def _with_choice_turns(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """Turns of choices appended to additional histories join `turns`, with their history index."""
        data = handler(self)
        extra = [
            turn.model_copy(update={"history": k}).model_dump(mode=info.mode)
            for k, history in enumerate(self.additional_histories, start=1)
            for turn in history._choice_turns
        ]
        if extra and isinstance(data, dict):
            data["turns"] = [*data.get("turns", []), *extra]
        return data

    def history_messages(self, history: int) -> list[ChatMessage]:
        if history == 0:
            return self.messages
        if not 1 <= history <= len(self.additional_histories):
            raise ValueError(f"history {history} does not exist in trajectory {self.id}")
        return self.additional_histories[history - 1].messages

    def histories(self) -> list[History]:
        return [History(messages=self.messages, tools=self.tools), *self.additional_histories]

    def timeline(self) -> list[Turn | ToolCallRecord]:
        """Model turns and tool calls in the order they happened."""
        events: list[tuple[int, int, Turn | ToolCallRecord]] = [(i + 1, 0, t) for i, t in enumerate(self.turns)]
        events += [(c.after_turn, 1, c) for c in self.tool_calls]
        return [event for _, _, event in sorted(events, key=lambda e: (e[0], e[1]))]

    def log(self, message: str) -> None:
        self.logs.append(message)

    def finish(self) -> Trajectory:
        """Stamp the end time and re-validate what users may have appended to lists by hand."""
        self.finished_at = time.time()
        Trajectory.model_validate(self.model_dump(warnings=False))  # validation names what is wrong
        return self

    @property
    def duration_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.started_at


class RolloutFailed(ArtError):
    """A rollout raised; the partial trajectory rides along so the group keeps the evidence."""

    def __init__(self, trajectory: Trajectory, cause: BaseException) -> None:
        super().__init__(f"rollout failed: {type(cause).__name__}: {cause}")
        self.trajectory = trajectory
        self.cause = cause


class RolloutException(Schema):
    """A failed rollout, kept with the group so failures are counted and inspectable."""

    type: str
    message: str
    traceback: str
    trajectory: Trajectory | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> RolloutException:
        trajectory = exc.trajectory if isinstance(exc, RolloutFailed) else None
        cause = exc.cause if isinstance(exc, RolloutFailed) else exc
        return cls(
            type=type(cause).__name__,
            message=str(cause),
            traceback="".join(traceback.format_exception(cause)),
            trajectory=trajectory,
        )


TrajectoryLike = Trajectory | Awaitable[Trajectory]


class TrajectoryGroup(Schema):
    """Rollouts of the same task; rewards are compared within a group.

    Accepts finished trajectories or awaitables of them (`await group` runs the awaitables);
    rollouts that raise are kept in `exceptions` instead of sinking the group.
    """

    schema_version: int = SCHEMA_VERSION
    trajectories: list[Trajectory] = Field(default_factory=list)
    exceptions: list[RolloutException] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    _pending: list[Awaitable[Trajectory]] = PrivateAttr(default_factory=list)

    def __init__(self, trajectories: Iterable[TrajectoryLike] = (), **data: Any) -> None:
        done: list[Trajectory] = []
        pending: list[Awaitable[Trajectory]] = []
        for item in trajectories:
            (done if isinstance(item, (Trajectory, dict)) else pending).append(item)  # type: ignore[arg-type]
        super().__init__(trajectories=done, **data)
        self._pending = pending

    @property
    def pending(self) -> int:
        return len(self._pending)

    def __await__(self) -> Generator[Any, None, TrajectoryGroup]:
        return self._resolve().__await__()

    async def _resolve(self) -> TrajectoryGroup:
        """Run the rollouts; one that raises is kept in `exceptions`, unless its error would stop every
        rollout (see `art_agents.fatal`): that one is raised at once and the others are cancelled."""
        pending, self._pending = self._pending, []
        try:
            results = await gather_or_cancel(_settle(item) for item in pending)
        finally:  # cancelled before some started (Ctrl-C, say): close those, so none is left never awaited
            close_unstarted(pending)
        for result in results:
            if isinstance(result, Trajectory):
                self.trajectories.append(result)
            else:
                self.exceptions.append(RolloutException.from_exception(result))
        return self

    def discard_pending(self) -> None:
        """Close rollouts that never started (the gather was cancelled first), so none is left never awaited."""
        pending, self._pending = self._pending, []
        close_unstarted(pending)

    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    def validate_for_training(self) -> None:
        """Raise a clear error for a group that cannot be trained on."""
        if self._pending:
            raise ValueError("group still has unfinished rollouts; `await` it (or use gather_trajectory_groups) first")
        if not self.trajectories:
            raise ValueError(
                "trajectory group has no trajectories"
                + (f" (all {len(self.exceptions)} rollouts raised)" if self.exceptions else "")
                + "; drop empty groups before training"
            )
        for trajectory in self.trajectories:
            Trajectory.model_validate(trajectory.model_dump())


async def _settle(item: Awaitable[Trajectory]) -> Trajectory | Exception:
    """The rollout's trajectory, or the exception it raised; a fatal error is raised instead."""
    try:
        result = await item
    except Exception as exc:
        fatal = fatal_error(exc)
        if fatal is None:
            return exc
        raise fatal from fatal.__cause__  # from its own cause: the RolloutFailed wrapper around it adds nothing
    if not isinstance(result, Trajectory):
        return TypeError(f"a rollout returned {type(result).__name__}, expected a Trajectory")
    return result


def validate_groups(groups: list[TrajectoryGroup]) -> None:
    """Check every group before training, naming the first bad one (`groups[i]: ...`)."""
    for index, group in enumerate(groups):
        try:
            group.validate_for_training()
        except ValueError as exc:
            raise ValueError(f"groups[{index}]: {exc}") from exc

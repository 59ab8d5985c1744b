"""Scoped capture: a contextvar holds the trajectory of the rollout running in this task.

Clients built by the toolkit, LangChain callbacks and the MCP wrapper call `record_completion` /
`record_tool_call`; outside a rollout those calls do nothing, and concurrent asyncio tasks each see their
own trajectory because contextvars are copied per task. Any other client of an art-agents server is
captured through the server (backends/server_capture.py), through hooks that add to a rollout's opening and closing.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import numbers
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar, Token
from typing import Any, ParamSpec, Protocol, overload

from art_agents.messages import ChatMessage, as_messages
from art_agents.trajectory import History, RolloutFailed, ToolCallRecord, Trajectory, Turn
from art_agents.wire import policy_step_of

_current: ContextVar[Trajectory | None] = ContextVar("art_agents_trajectory", default=None)
_span: ContextVar[str | None] = ContextVar("art_agents_span", default=None)
_request_overrides: ContextVar[dict[str, Any] | None] = ContextVar("art_agents_request_overrides", default=None)


P = ParamSpec("P")


class RolloutHooks(Protocol):
    """What a capture path does as rollouts open and close (backends/server_capture.py fetches the server's calls)."""

    def enter(self) -> None: ...
    def exit(self, trajectory: Trajectory) -> None: ...
    async def aexit(self, trajectory: Trajectory) -> None: ...


_hooks: list[RolloutHooks] = []


def add_rollout_hooks(hooks: RolloutHooks) -> None:
    if hooks not in _hooks:
        _hooks.append(hooks)


def current_trajectory() -> Trajectory | None:
    """The trajectory of the rollout running in this context, or None outside a rollout."""
    return _current.get()


@contextlib.contextmanager
def span(name: str) -> Iterator[None]:
    """Label model calls made inside (a graph node, a tool) so turns say where they came from."""
    token = _span.set(name)
    try:
        yield
    finally:
        _span.reset(token)


def request_overrides() -> dict[str, Any] | None:
    """Fields every chat completion request made in this context carries instead of its own, or None."""
    return _request_overrides.get()


@contextlib.contextmanager
def overriding_requests(fields: dict[str, Any]) -> Iterator[None]:
    """Set `fields` (the model name of a pinned step, the temperature of greedy decoding) in every chat completion
    request that clients the toolkit builds make inside: how an evaluation runs a rollout written for one model
    against another model, or greedily, without changing the rollout."""
    token = _request_overrides.set(fields or None)
    try:
        yield
    finally:
        _request_overrides.reset(token)


class Rollout:
    """Context manager that opens a trajectory for the calls made inside (see `rollout`)."""

    def __init__(self, trajectory: Trajectory | None = None, **metadata: Any) -> None:
        self.trajectory = trajectory if trajectory is not None else Trajectory()
        self.trajectory.metadata.update(metadata)
        self._token: Token[Trajectory | None] | None = None

    def __enter__(self) -> Trajectory:
        for hooks in _hooks:
            hooks.enter()
        self._token = _current.set(self.trajectory)
        return self.trajectory

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        for hooks in _hooks:
            hooks.exit(self.trajectory)
        self._close(exc)

    def _close(self, exc: BaseException | None) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        if exc is None:
            self.trajectory.finish()
            return
        if isinstance(exc, Exception) and not isinstance(exc, RolloutFailed):
            self.trajectory.failed = True
            self.trajectory.finished_at = time.time()
            self.trajectory.log(f"rollout raised {type(exc).__name__}: {exc}")
            raise RolloutFailed(self.trajectory, exc) from exc

    async def __aenter__(self) -> Trajectory:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        for hooks in _hooks:
            await hooks.aexit(self.trajectory)
        self._close(exc)


@overload
def rollout(func: Callable[P, Awaitable[Any]], /) -> Callable[P, Awaitable[Trajectory]]: ...
@overload
def rollout(trajectory: Trajectory | None = None, /, **metadata: Any) -> Rollout: ...
def rollout(target: Any = None, /, **metadata: Any) -> Any:
    """Capture the model calls of one rollout into a Trajectory.

    `async with rollout(task="x") as traj:` (or plain `with`), or as a decorator on an async
    function, which then returns the Trajectory; a number it returns becomes the reward. An
    exception inside marks the trajectory failed, logs the error and re-raises it as
    `RolloutFailed` carrying the partial trajectory, so a group counts the failure and keeps
    what was recorded.
    """
    if callable(target) and not isinstance(target, Trajectory):
        return decorate_rollout(target)
    return Rollout(target, **metadata)


def decorate_rollout(
    func: Callable[P, Awaitable[Any]], scope: Callable[[], Any] = Rollout
) -> Callable[P, Awaitable[Trajectory]]:
    """`scope` opens a fresh capture scope per call (integrations add their own capture to it)."""
    if not inspect.iscoroutinefunction(func):
        raise TypeError(f"@rollout decorates async functions; {func.__qualname__} is not one")

    @functools.wraps(func)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Trajectory:
        async with scope() as trajectory:
            result = await func(*args, **kwargs)
            if isinstance(result, Trajectory):
                return result
            if isinstance(result, numbers.Real) and not isinstance(result, bool):
                trajectory.reward = float(result)
        return trajectory

    return wrapper


def record_completion(
    request_messages: list[Any],
    response_message: Any,
    *,
    tools: list[dict[str, Any]] | None = None,
    completion_id: str | None = None,
    model: str | None = None,
    latency_s: float = 0.0,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    span: str | None = None,
    trajectory: Trajectory | None = None,
    started_at: float | None = None,
) -> Turn | None:
    """Append one model call to the current trajectory; a no-op outside a rollout.

    The call joins the history whose messages its request extends; otherwise it starts a new one
    (a different system prompt, or a history rewritten between calls).
    """
    trajectory = trajectory if trajectory is not None else _current.get()
    if trajectory is None:
        return None
    request = as_messages(list(request_messages))
    response = (
        response_message if isinstance(response_message, ChatMessage) else ChatMessage.model_validate(response_message)
    )
    if completion_id is not None and any(t.completion_id == completion_id for t in trajectory.turns):
        return None  # seen through two paths (transport and callback): record once
    if completion_id is not None and (known := _unidentified(trajectory, request, response)) is not None:
        # recorded already without its id (LangChain drops it from streams): the server's copy names it
        known.completion_id, known.model, known.policy_step = completion_id, model, policy_step_of(model)
        return None
    history = _history_for(trajectory, request, tools)
    messages = [*request, response]
    if history == 0:
        trajectory.messages = messages
        if tools:
            trajectory.tools = tools
    else:
        trajectory.additional_histories[history - 1].messages = messages
    turn = Turn(
        history=history,
        index=len(request),
        completion_id=completion_id,
        model=model,
        policy_step=policy_step_of(model),
        span=span if span is not None else _span.get(),
        latency_s=latency_s,
        started_at=started_at if started_at is not None else time.time() - latency_s,
        finish_reason=finish_reason,
        usage=usage,
    )
    trajectory.turns.append(turn)
    return turn


def record_tool_call(
    name: str,
    arguments: dict[str, Any] | str,
    *,
    result: str | None = None,
    error: str | None = None,
    duration_s: float = 0.0,
    tool_call_id: str | None = None,
    span: str | None = None,
    trajectory: Trajectory | None = None,
) -> ToolCallRecord | None:
    """Record one executed tool call in the current trajectory; a no-op outside a rollout."""
    trajectory = trajectory if trajectory is not None else _current.get()
    if trajectory is None:
        return None
    record = ToolCallRecord(
        name=name,
        arguments=arguments,
        result=result,
        error=error,
        duration_s=duration_s,
        tool_call_id=tool_call_id,
        span=span if span is not None else _span.get(),
        after_turn=len(trajectory.turns),
        started_at=time.time() - duration_s,
    )
    trajectory.tool_calls.append(record)
    return record


def record_tool_result(
    tool_call_id: str, content: str, *, name: str | None = None, trajectory: Trajectory | None = None
) -> None:
    """Append a tool result when the agent's next request has not yet done so.

    It goes to the history whose assistant message made the call (the main one if none did).
    """
    trajectory = trajectory if trajectory is not None else _current.get()
    if trajectory is None:
        return
    histories = [trajectory.messages, *(h.messages for h in trajectory.additional_histories)]
    calling = (m for m in histories if any(c.id == tool_call_id for a in m for c in a.tool_calls or []))
    messages = next(calling, trajectory.messages)
    if any(m.role == "tool" and m.tool_call_id == tool_call_id for m in messages):
        return
    messages.append(ChatMessage(role="tool", content=content, tool_call_id=tool_call_id, name=name))


def _unidentified(trajectory: Trajectory, request: list[ChatMessage], response: ChatMessage) -> Turn | None:
    """A turn recorded without a completion id whose request and response are these."""
    for turn in trajectory.turns:
        if turn.completion_id is not None or turn.index != len(request):
            continue
        messages = trajectory.history_messages(turn.history)
        if len(messages) > turn.index and messages[turn.index].same_as(response) and _is_prefix(request, messages):
            return turn
    return None


def _history_for(trajectory: Trajectory, request: list[ChatMessage], tools: list[dict[str, Any]] | None) -> int:
    histories = [trajectory.messages, *(h.messages for h in trajectory.additional_histories)]
    for index, messages in enumerate(histories):
        if _is_prefix(messages, request) and (messages or index == 0):
            return index
    trajectory.additional_histories.append(History(tools=tools))
    return len(trajectory.additional_histories)


def _is_prefix(prefix: list[ChatMessage], messages: list[ChatMessage]) -> bool:
    if len(prefix) > len(messages):
        return False
    return all(a.same_as(b) for a, b in zip(prefix, messages, strict=False))

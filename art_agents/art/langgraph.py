"""OpenPipe ART's LangGraph idioms, `init_chat_model` and `wrap_rollout`, on top of `graph_rollout`.

ART programs import these from `art.langgraph`; here they are `art_agents.langgraph`::

    async def rollout(model, scenario) -> Trajectory:
        agent = create_react_agent(init_chat_model(model.name, temperature=1.0), tools)
        await agent.ainvoke({"messages": [("user", scenario)]})
        return Trajectory(reward=...)

    trajectory = await wrap_rollout(model, rollout)(model, scenario)

No second capture mechanism: `wrap_rollout` runs the function inside `graph_rollout`, whose
LangChain callbacks and capture transport record every call with its completion id, and then
hands the captured messages and turns to the trajectory the function returned. Needs the `langgraph`
extra; our own LangGraph door is `art_agents.integrations.langgraph` (`wrap`, `graph_rollout`).
"""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar, overload

from pydantic import BaseModel

from art_agents.errors import ArtError
from art_agents.extras import extra_imports
from art_agents.model import Model
from art_agents.trajectory import Trajectory

with extra_imports("langgraph", purpose="art_agents.langgraph"):
    from langchain_core.language_models import BaseChatModel, LanguageModelInput
    from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
    from langchain_core.runnables import Runnable
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langchain_openai import ChatOpenAI

    from art_agents.integrations.langgraph import GraphRollout, chat_openai_args

__all__ = ["init_chat_model", "wrap_rollout"]

P = ParamSpec("P")
T = TypeVar("T", bound=Trajectory)

_rollout_model: ContextVar[Model | None] = ContextVar("art_agents_wrap_rollout_model", default=None)


class ToolStructuredChatOpenAI(ChatOpenAI):
    """`ChatOpenAI` whose `with_structured_output(schema)` asks through a tool, as ART's chat model does.

    The art-agents server honours neither `response_format` nor a forced `tool_choice` (LangChain's
    two methods), so the schema is bound as an ordinary tool and the first call's arguments are
    parsed (`None` when the model answered without calling it). Any other argument
    (`method=`, `include_raw=`, ...) gets LangChain's own implementation.
    """

    def with_structured_output(  # type: ignore[override]
        self, schema: Any = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, Any]:
        if kwargs or schema is None:
            return super().with_structured_output(schema, **kwargs)
        parser: Runnable[Any, Any]
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            parser = PydanticToolsParser(tools=[schema], first_tool_only=True)
        else:
            name = convert_to_openai_tool(schema)["function"]["name"]
            parser = JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        return self.bind_tools([schema]) | parser


def init_chat_model(
    model: str | None = None,
    *,
    model_provider: str | None = None,
    configurable_fields: Any = None,
    config_prefix: str | None = None,
    chat_model: BaseChatModel | None = None,
    timeout_seconds: float | None = None,
    **kwargs: Any,
) -> BaseChatModel:
    """A LangChain chat model for the model of the enclosing `wrap_rollout`, as in ART.

    A `ChatOpenAI` on that model's server with the capture clients; `model` (the name sent,
    default the model's served name), `temperature` (default 1.0, as ART), `base_url`, `api_key`
    and any other keyword go to `ChatOpenAI`. `chat_model=` is returned as is (its calls are
    captured through the callbacks). `model_provider`, `configurable_fields` and `config_prefix`
    are accepted for LangChain's signature and ignored, as in ART. Differences from ART:
    `timeout_seconds` is the per-request timeout of the OpenAI client rather than a limit on the
    whole `ainvoke`, and `with_retry()` is LangChain's (ART's makes it a no-op).

    Raises `ArtError` outside a rollout wrapped by `wrap_rollout`.
    """
    del model_provider, configurable_fields, config_prefix  # LangChain's signature; ART ignores them too
    current = _rollout_model.get()
    if current is None:
        raise ArtError(
            "init_chat_model() was called outside a wrapped rollout: it builds the chat model of the rollout "
            "that wrap_rollout(model, rollout_fn) runs, so call it inside rollout_fn and run "
            "`await wrap_rollout(model, rollout_fn)(...)`"
        )
    if chat_model is not None:
        return chat_model
    options: dict[str, Any] = {**chat_openai_args(current), "temperature": 1.0, **kwargs}
    if model is not None:
        options["model"] = model
    if timeout_seconds is not None:
        options["timeout"] = timeout_seconds
    return ToolStructuredChatOpenAI(**options)


@overload
def wrap_rollout(model: Model, fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]: ...
@overload
def wrap_rollout(model: Model, fn: Callable[P, Awaitable[float | None]]) -> Callable[P, Awaitable[Trajectory]]: ...
def wrap_rollout(model: Model, fn: Callable[P, Awaitable[Any]]) -> Callable[P, Awaitable[Trajectory]]:
    """`fn` as a captured rollout of `model`, as in ART: `await wrap_rollout(model, fn)(*args)`.

    Each call runs `fn` in its own `graph_rollout(model=model)` scope, where `init_chat_model()`
    builds `model`'s chat model, and returns the Trajectory `fn` returned (the same object, so a
    subclass keeps its fields) with the captured calls filled in: `messages` and `tools` of the main
    conversation, other conversations appended to `additional_histories`, and `turns` with the
    completion ids the server trains on. A function that made no model call keeps its messages.
    Beyond ART: `fn` may return a number (the reward) or None instead, giving the captured
    trajectory; the trajectory takes the rollout id the server counted calls under; and an
    exception in `fn` raises `RolloutFailed` carrying the partial trajectory, which
    `gather_trajectory_groups` counts instead of losing the group.
    """

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Trajectory:
        token = _rollout_model.set(model)
        try:
            scope = GraphRollout(model=model)
            async with scope:
                result = fn(*args, **kwargs)
                result = await result if inspect.isawaitable(result) else result
        finally:
            _rollout_model.reset(token)
        return _returned(result, scope.trajectory, fn)

    return wrapper


def _returned(result: Any, captured: Trajectory, fn: Callable[..., Any]) -> Trajectory:
    """The trajectory a wrapped rollout returns: `result` with what was captured, or `captured` itself."""
    if result is None or result is captured:
        return captured
    if isinstance(result, numbers.Real) and not isinstance(result, bool):
        captured.reward = float(result)
        return captured
    if not isinstance(result, Trajectory):
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(f"wrap_rollout: {name} returned {type(result).__name__}; return an art_agents.Trajectory")
    if captured.turns:
        offset = len(result.additional_histories)  # captured history k > 0 lands after the ones fn made
        result.turns = []  # assignments are validated: clear the turns before their messages change
        result.messages = captured.messages
        result.tools = captured.tools
        result.additional_histories = [*result.additional_histories, *captured.additional_histories]
        result.turns = [
            t.model_copy(update={"history": t.history + offset}) if t.history else t for t in captured.turns
        ]
    result.id = captured.id
    result.tool_calls = [*result.tool_calls, *captured.tool_calls]
    result.metrics = {**result.metrics, **captured.metrics}
    result.logs = [*result.logs, *captured.logs]
    return result.finish()

"""Train an existing LangGraph agent: a captured `ChatOpenAI`, and `wrap(graph)` for rollouts.

The one- or two-line change for a user::

    llm = model.chat_model()                  # instead of ChatOpenAI(...)
    agent = wrap(create_agent(llm, tools))    # then: trajectory, state = await agent.ainvoke(inputs)

Capture runs through LangChain callbacks (node names, bound tools, run ids, completion ids), so a
`ChatOpenAI` the user built with `base_url` pointing at the server is captured too; clients from
`chat_model` also send the rollout id, which lets the server confirm that no call was missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, overload

import httpx

from art_agents.backends.transport import CaptureAsyncTransport, CaptureTransport
from art_agents.capture import Rollout, current_trajectory, decorate_rollout
from art_agents.integrations import call_check
from art_agents.integrations.call_check import MissingCallsWarning
from art_agents.integrations.langchain_callbacks import CaptureHandler, active_handler
from art_agents.model import Model
from art_agents.trajectory import RolloutFailed, Trajectory
from art_agents.wire import ROLLOUT_HEADER

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI

__all__ = [
    "AsyncGraphStream",
    "GraphResult",
    "GraphRollout",
    "GraphStream",
    "MissingCallsWarning",
    "WrappedGraph",
    "chat_model",
    "graph_rollout",
    "http_clients",
    "rollout_headers",
    "wrap",
]

T = TypeVar("T")
Reward = Callable[[Any, Trajectory], float | Awaitable[float]]


def http_clients() -> dict[str, httpx.Client | httpx.AsyncClient]:
    """`http_client` and `http_async_client` for a `ChatOpenAI` the user builds.

    Its calls then carry the rollout id and are recorded with their completion ids even when
    streamed: `ChatOpenAI(base_url=..., **http_clients())`.
    """
    return {
        "http_client": httpx.Client(transport=CaptureTransport()),
        "http_async_client": httpx.AsyncClient(transport=CaptureAsyncTransport()),
    }


def chat_model(model: Model, **kwargs: Any) -> ChatOpenAI:
    """A `ChatOpenAI` for `model`'s server whose calls are captured inside rollouts.

    Keyword arguments go to `ChatOpenAI` (temperature, max_tokens, ...) and win over the defaults.
    """
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(**{**chat_openai_args(model), **kwargs})


def chat_openai_args(model: Model) -> dict[str, Any]:
    """`ChatOpenAI` arguments for `model`'s server with the capture clients (model, base_url, api_key, ...)."""
    base_url, api_key = model.endpoint()
    return {"model": model.served_name, "base_url": base_url, "api_key": api_key, **http_clients()}


def rollout_headers() -> dict[str, str]:
    """The rollout header for `ChatOpenAI(default_headers=...)`, built inside the rollout.

    Lets the server count a user-built client's calls for the missing-call check; `{}` outside a
    rollout.
    """
    trajectory = current_trajectory()
    return {ROLLOUT_HEADER: trajectory.id} if trajectory is not None else {}


class GraphRollout:
    """A rollout that also captures LangChain/LangGraph calls; a context manager (sync or async).

    On exit, tool results that no model call sent back are appended, and, when the run succeeded,
    the server's count of completions for this rollout is compared with the captured turns.
    """

    def __init__(
        self,
        trajectory: Trajectory | None = None,
        *,
        model: Model | None = None,
        check_calls: bool = True,
        **metadata: Any,
    ) -> None:
        self._rollout = Rollout(trajectory, **metadata)
        self.trajectory = self._rollout.trajectory
        self.handler = CaptureHandler(self.trajectory)
        self.model = model
        self.check_calls = check_calls
        self._token: contextvars.Token[CaptureHandler | None] | None = None

    def __enter__(self) -> Trajectory:
        trajectory = self._rollout.__enter__()
        self._token = active_handler.set(self.handler)
        return trajectory

    def _detach(self) -> None:
        if self._token is not None:
            active_handler.reset(self._token)
            self._token = None
        self.handler.flush_tool_results()

    def _should_check(self, exc: BaseException | None) -> bool:
        """True when the call check should run (the scope closed without an exception)."""
        if exc is not None or not self.check_calls or not self._base_urls():
            return False
        # only art-agents servers count rollouts; skip the request when other providers answered every call
        turns = self.trajectory.turns
        return not turns or any(turn.policy_step is not None for turn in turns)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._detach()
        self._rollout.__exit__(exc_type, exc, tb)  # raises RolloutFailed for an exception
        if self._should_check(exc):
            self._compare(call_check.served(self._base_urls(), self.trajectory.id, self._api_key()))

    async def __aenter__(self) -> Trajectory:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._detach()
        await self._rollout.__aexit__(exc_type, exc, tb)
        if self._should_check(exc):
            self._compare(await call_check.served_async(self._base_urls(), self.trajectory.id, self._api_key()))

    def __call__(self, func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Trajectory]]:
        """`@graph_rollout(model=model)`: a fresh scope (and trajectory) per call."""
        return decorate_rollout(
            func, lambda: GraphRollout(model=self.model, check_calls=self.check_calls, **self.trajectory.metadata)
        )

    def _base_urls(self) -> set[str]:
        if self.model is not None and self.model.inference_base_url:
            return {self.model.inference_base_url}
        return set(self.handler.base_urls)

    def _api_key(self) -> str | None:
        return self.model.inference_api_key if self.model is not None else None

    def _compare(self, served: int | None) -> None:
        call_check.compare(self.trajectory, served, self.handler.nodes, self.handler.failed_nodes)


@overload
def graph_rollout(func: Callable[..., Awaitable[Any]], /) -> Callable[..., Awaitable[Trajectory]]: ...
@overload
def graph_rollout(
    trajectory: Trajectory | None = None, /, *, model: Model | None = None, check_calls: bool = True, **metadata: Any
) -> GraphRollout: ...
def graph_rollout(target: Any = None, /, **kwargs: Any) -> Any:
    """Like `art_agents.rollout`, and LangChain calls inside are captured too.

    `@graph_rollout` on an async function that runs the graph returns its Trajectory (a number
    it returns becomes the reward); `async with graph_rollout(model=model) as traj:` captures a
    block. Passing `model` lets the missing-call check ask that model's server.
    """
    if callable(target) and not isinstance(target, Trajectory):
        return decorate_rollout(target, GraphRollout)
    return GraphRollout(target, **kwargs)


class GraphResult(NamedTuple):
    """What a wrapped graph's `invoke`/`ainvoke` returns: `trajectory, output = ...`."""

    trajectory: Trajectory
    output: Any


async def _in_context(context: contextvars.Context, awaitable: Awaitable[T]) -> T:
    """Await in `context`, so a stream's capture scope spans every step wherever it is iterated."""

    async def step() -> T:
        return await awaitable

    coroutine: Coroutine[Any, Any, T] = step()
    return await asyncio.create_task(coroutine, context=context)


class AsyncGraphStream:
    """The chunks of `graph.astream`, captured; `trajectory` is complete once iteration ends."""

    def __init__(self, scope: GraphRollout, start: Callable[[], AsyncIterator[Any]]) -> None:
        self._scope, self._start = scope, start
        self.trajectory = scope.trajectory

    async def _captured(self) -> AsyncIterator[Any]:
        async with self._scope, contextlib.aclosing(self._start()) as chunks:
            async for chunk in chunks:
                yield chunk

    async def __aiter__(self) -> AsyncIterator[Any]:
        # Every step runs in one context of its own: the scope spans the whole stream, the consumer's
        # code between chunks is not captured, and concurrent streams cannot see each other's trajectories.
        context = contextvars.copy_context()
        captured = self._captured()
        try:
            while True:
                try:
                    chunk = await _in_context(context, anext(captured))
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            await _in_context(context, captured.aclose())


class GraphStream:
    """The chunks of `graph.stream`, captured; `trajectory` is complete once iteration ends."""

    def __init__(self, scope: GraphRollout, start: Callable[[], Iterator[Any]]) -> None:
        self._scope, self._start = scope, start
        self.trajectory = scope.trajectory

    def _captured(self) -> Iterator[Any]:
        with self._scope:
            yield from self._start()  # closing this generator closes the graph's stream too

    def __iter__(self) -> Iterator[Any]:
        context = contextvars.copy_context()  # as in AsyncGraphStream
        captured = self._captured()
        try:
            while True:
                try:
                    chunk = context.run(next, captured)
                except StopIteration:
                    return
                yield chunk
        finally:
            context.run(captured.close)


class WrappedGraph:
    """A compiled graph whose runs are rollouts: each call returns (or exposes) its Trajectory.

    Other attributes pass through to the graph, so `get_graph()` and friends still work.
    """

    def __init__(self, graph: Any, *, model: Model | None = None, check_calls: bool = True) -> None:
        self.graph = graph
        self.model = model
        self.check_calls = check_calls

    def _scope(self, trajectory: Trajectory | None) -> GraphRollout:
        return GraphRollout(trajectory, model=self.model, check_calls=self.check_calls)

    async def ainvoke(
        self, input: Any, config: Any = None, *, trajectory: Trajectory | None = None, **kwargs: Any
    ) -> GraphResult:
        """Run the graph in a rollout; raises `RolloutFailed` (carrying the trajectory) if it raises."""
        scope = self._scope(trajectory)
        async with scope:
            output = await self.graph.ainvoke(input, config, **kwargs)
        return GraphResult(scope.trajectory, output)

    def invoke(
        self, input: Any, config: Any = None, *, trajectory: Trajectory | None = None, **kwargs: Any
    ) -> GraphResult:
        scope = self._scope(trajectory)
        with scope:
            output = self.graph.invoke(input, config, **kwargs)
        return GraphResult(scope.trajectory, output)

    def astream(
        self, input: Any, config: Any = None, *, trajectory: Trajectory | None = None, **kwargs: Any
    ) -> AsyncGraphStream:
        return AsyncGraphStream(self._scope(trajectory), lambda: self.graph.astream(input, config, **kwargs))

    def stream(
        self, input: Any, config: Any = None, *, trajectory: Trajectory | None = None, **kwargs: Any
    ) -> GraphStream:
        return GraphStream(self._scope(trajectory), lambda: self.graph.stream(input, config, **kwargs))

    async def rollout(self, input: Any, reward: Reward | None = None, config: Any = None, **kwargs: Any) -> Trajectory:
        """One rollout scored by `reward(output, trajectory)` (sync or async): fits in a TrajectoryGroup.

        The reward runs after capture ends, so a judge's own model calls are not recorded; if it
        raises, the rollout counts as failed.
        """
        trajectory, output = await self.ainvoke(input, config, **kwargs)
        if reward is None:
            return trajectory
        try:
            value = reward(output, trajectory)
            trajectory.reward = float(await value if inspect.isawaitable(value) else value)
        except Exception as exc:
            trajectory.failed = True
            trajectory.log(f"reward function raised {type(exc).__name__}: {exc}")
            raise RolloutFailed(trajectory, exc) from exc
        return trajectory

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)


def wrap(graph: Any, *, model: Model | None = None, check_calls: bool = True) -> WrappedGraph:
    """Wrap a compiled LangGraph graph so each run is captured as a Trajectory.

    `model` (optional) names the server for the missing-call check; without it the check asks
    the servers the graph's `ChatOpenAI` clients point at.
    """
    return WrappedGraph(graph, model=model, check_calls=check_calls)

"""A LangChain callback handler that records a graph's model calls into one trajectory.

Callbacks see every chat model call whatever client made it (a user-built `ChatOpenAI` too), with
the LangGraph node in `metadata`, the bound tools in `invocation_params` and the answer's completion
id in `response_metadata`. Calls that the capture transport already recorded (clients from
`chat_model`) are matched instead of recorded twice; the match lends them the node name. Tool runs
become `ToolCallRecord`s (what ran, for how long, whether it failed) unless the tool was an MCP call
that the MCP session already recorded.

The handler is installed through a LangChain configure hook on a contextvar, so every runnable
configured inside a capture scope gets it, including model calls made without passing `config`,
and concurrent rollouts each see their own handler.
"""

from __future__ import annotations

import json
import threading
import time
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from art_agents.capture import record_completion, record_tool_call, record_tool_result
from art_agents.extras import extra_imports
from art_agents.messages import ChatMessage, as_messages
from art_agents.trajectory import ToolCallRecord, Trajectory, Turn

with extra_imports("langgraph", purpose="art_agents.integrations.langgraph"):
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import BaseMessage, ToolMessage, convert_to_openai_messages
    from langchain_core.outputs import LLMResult
    from langchain_core.tracers.context import register_configure_hook

active_handler: ContextVar[CaptureHandler | None] = ContextVar("art_agents_langchain_handler", default=None)
register_configure_hook(active_handler, inheritable=True)


def to_openai(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as OpenAI chat dicts (the trajectory's wire shape)."""
    return list(convert_to_openai_messages(messages))


def node_path(metadata: dict[str, Any] | None) -> str | None:
    """`outer/inner` for a node inside a sub-graph, from LangGraph's checkpoint namespace."""
    metadata = metadata or {}
    namespace = metadata.get("langgraph_checkpoint_ns") or ""
    names = [part.split(":", 1)[0] for part in namespace.split("|") if part]
    return "/".join(names) if names else metadata.get("langgraph_node")


class _PendingCall:
    def __init__(self, request: list[dict[str, Any]], tools: list[dict[str, Any]] | None, node: str | None) -> None:
        self.request, self.tools, self.node = request, tools, node
        self.started = time.perf_counter()


class _PendingTool:
    def __init__(
        self, name: str, arguments: dict[str, Any] | str, tool_call_id: str | None, node: str | None, first: int
    ) -> None:
        self.name, self.arguments, self.tool_call_id, self.node = name, arguments, tool_call_id, node
        self.first = first  # tool records before this run began: an MCP call made by the tool comes after
        self.started = time.perf_counter()


class CaptureHandler(BaseCallbackHandler):
    """Records chat model calls and tool results of one rollout into its trajectory."""

    run_inline = True  # cheap bookkeeping: no thread hop, so records keep the order of events
    raise_error = False

    def __init__(self, trajectory: Trajectory) -> None:
        self.trajectory = trajectory
        self.base_urls: set[str] = set()
        self.nodes: list[str] = []
        self.failed_nodes: list[str] = []
        self._pending: dict[UUID, _PendingCall] = {}
        self._claimed: set[int] = set()  # id() of turns already matched to a callback
        self._tool_results: dict[str, ChatMessage] = {}
        self._tools: dict[UUID, _PendingTool] = {}
        self._claimed_mcp: set[int] = set()  # id() of MCP records already matched to a tool run
        self._lock = threading.Lock()

    # -- graph nodes ---------------------------------------------------------------------------
    def on_chain_start(
        self, serialized: dict[str, Any] | None, inputs: Any, *, metadata: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        node = node_path(metadata)
        if node and (metadata or {}).get("langgraph_node") == kwargs.get("name") and node not in self.nodes:
            with self._lock:
                self.nodes.append(node)

    # -- model calls ---------------------------------------------------------------------------
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        invocation_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        base_url = ((serialized or {}).get("kwargs") or {}).get("openai_api_base")
        tools = (invocation_params or {}).get("tools")
        with self._lock:
            if isinstance(base_url, str):
                self.base_urls.add(base_url)
            self._pending[run_id] = _PendingCall(to_openai(messages[0]), tools or None, node_path(metadata))

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            call = self._pending.pop(run_id, None)
            if call is None or not response.generations or not response.generations[0]:
                return
            generation = response.generations[0][0]
            message = getattr(generation, "message", None)
            if message is None:
                return
            info = {**(generation.generation_info or {}), **message.response_metadata}
            reply = ChatMessage.model_validate(to_openai([message])[0])
            completion_id = info.get("id") or (response.llm_output or {}).get("id")
            if self._claim(call, reply, completion_id):
                return
            turn = record_completion(
                call.request,
                reply,
                tools=call.tools,
                completion_id=completion_id,
                model=info.get("model_name"),
                latency_s=time.perf_counter() - call.started,
                finish_reason=info.get("finish_reason"),
                usage=info.get("token_usage"),
                span=call.node,
                trajectory=self.trajectory,
            )
            if turn is not None:
                self._claimed.add(id(turn))

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            call = self._pending.pop(run_id, None)
            node = call.node if call else None
            if node:
                self.failed_nodes.append(node)
            self.trajectory.log(f"model call in node {node or '?'} failed: {type(error).__name__}: {error}")

    def _claim(self, call: _PendingCall, reply: ChatMessage, completion_id: str | None) -> bool:
        """Match a turn the transport recorded for this call, and give it the node name."""
        request = as_messages(call.request)
        for turn in list(self.trajectory.turns):
            if id(turn) in self._claimed:
                continue
            if completion_id is not None:
                matched = turn.completion_id == completion_id
            else:  # streamed answers lose the completion id in LangChain: match by content
                matched = self._same_call(turn, request, reply)
            if matched:
                self._claimed.add(id(turn))
                if turn.span is None:
                    turn.span = call.node
                return True
        return False

    def _same_call(self, turn: Turn, request: list[ChatMessage], reply: ChatMessage) -> bool:
        messages = self.trajectory.history_messages(turn.history)
        if turn.index != len(request) or not messages[turn.index].same_as(reply):
            return False
        return all(a.same_as(b) for a, b in zip(messages[: turn.index], request, strict=True))

    # -- tools -------------------------------------------------------------------------------
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        tool_call_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
        # JSON-safe copy: the record goes to the server with the trajectory
        arguments = json.loads(json.dumps(inputs, default=str)) if inputs is not None else input_str
        with self._lock:
            first = len(self.trajectory.tool_calls)
            self._tools[run_id] = _PendingTool(name, arguments, tool_call_id, node_path(metadata), first)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            if isinstance(output, ToolMessage) and output.tool_call_id:
                self._tool_results[output.tool_call_id] = ChatMessage.model_validate(to_openai([output])[0])
            call = self._tools.pop(run_id, None)
            if call is None:
                return
            if isinstance(output, ToolMessage):
                text = ChatMessage.model_validate(to_openai([output])[0]).text()
                self._record_tool(call, text, text if output.status == "error" else None)
            else:
                self._record_tool(call, str(output), None)

    def on_tool_error(
        self, error: BaseException, *, run_id: UUID, metadata: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        with self._lock:
            self.trajectory.log(f"tool in node {node_path(metadata) or '?'} raised {type(error).__name__}: {error}")
            call = self._tools.pop(run_id, None)
            if call is not None:
                self._record_tool(call, None, f"{type(error).__name__}: {error}")

    def _record_tool(self, call: _PendingTool, result: str | None, error: str | None) -> None:
        """Record a tool run, unless it was an MCP call the session recorded (that record gets the call id)."""
        mcp = self._mcp_record(call)
        if mcp is not None:
            if mcp.tool_call_id is None:
                mcp.tool_call_id = call.tool_call_id
            return
        record_tool_call(
            call.name,
            call.arguments,
            result=result,
            error=error,
            duration_s=time.perf_counter() - call.started,
            tool_call_id=call.tool_call_id,
            span=call.node,
            trajectory=self.trajectory,
        )

    def _mcp_record(self, call: _PendingTool) -> ToolCallRecord | None:
        """An MCP record made while this tool ran, for the same tool name or the same arguments."""
        for record in self.trajectory.tool_calls[call.first :]:
            if id(record) in self._claimed_mcp or not (record.span or "").startswith("mcp:"):
                continue
            if record.name == call.name or record.arguments == call.arguments:
                self._claimed_mcp.add(id(record))
                return record
        return None

    def flush_tool_results(self) -> None:
        """Append tool results that no later model call sent back (the run ended on a tool node).

        Done at the end, in the order of the calls, because parallel tools finish in any order and
        an out-of-order history would no longer be a prefix of the agent's next request.
        """
        with self._lock:
            for history in self.trajectory.histories():
                last = next((m for m in reversed(history.messages) if m.role == "assistant"), None)
                for call in (last.tool_calls or []) if last else []:
                    result = self._tool_results.get(call.id)
                    if result is not None:
                        record_tool_result(call.id, result.text(), name=result.name, trajectory=self.trajectory)

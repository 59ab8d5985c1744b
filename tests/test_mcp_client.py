"""The recording MCP client against real MCP servers: our own (stdio and HTTP) and published ones."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mcp.types as types
import openai
import psutil
import pytest
from mcp_fixtures import (
    BAD_SCHEMA_COMMAND,
    KV_COMMAND,
    TIME_COMMAND,
    calculator_command,  # noqa: F401
    free_port,
    kv_http,  # noqa: F401
    kv_http_server,
    kv_server,
)
from pydantic import ValidationError
from server_fixtures import hermes

from art_agents import (
    Model,
    RolloutFailed,
    ToolCallRecord,
    Trajectory,
    TrajectoryGroup,
    Turn,
    gather_trajectory_groups,
    rollout,
)
from art_agents.errors import SetupError
from art_agents.integrations.mcp import MCPError, MCPSchemaError, MCPServer
from art_agents.integrations.mcp_connection import MCPUnreachable
from art_agents.integrations.mcp_tools import openai_names, openai_tool, result_text
from art_agents.messages import ToolCall

KV_TOOLS = ["put", "get", "keys", "kv.size", "slow", "setting", "crash"]


def gone(pid: int, within_s: float = 30.0) -> bool:
    """Whether process `pid` has exited (a zombie counts: it no longer runs) within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def call(call_id: str, name: str, **arguments: object) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


# --- the server description ---------------------------------------------------------------------


def test_server_parse_labels_and_validation() -> None:
    server = MCPServer.parse("uvx mcp-server-time --local-timezone 'Europe/Paris'", tool_timeout_s=5)
    assert server.command == ["uvx", "mcp-server-time", "--local-timezone", "Europe/Paris"]
    assert (server.label, server.tool_timeout_s) == ("mcp-server-time", 5)
    assert MCPServer.parse(TIME_COMMAND).label == "mcp_server_time"
    assert MCPServer.parse(KV_COMMAND).label == "kv_server"
    assert MCPServer.parse(["npx", "-y", "@modelcontextprotocol/server-memory@1.0"]).label == "server-memory"
    assert MCPServer.parse(["/usr/local/bin/my-server", "--x"]).label == "my-server"
    assert MCPServer.parse(command=["x"], name="mine").label == "mine"
    http = MCPServer.parse("https://tools.example.com/mcp", headers={"Authorization": "Bearer t"})
    assert (http.url, http.command, http.label) == ("https://tools.example.com/mcp", None, "tools.example.com")
    with pytest.raises(ValidationError, match="exactly one of"):
        MCPServer()
    with pytest.raises(ValidationError, match="exactly one of"):
        MCPServer(command=["x"], url="http://h/mcp")
    with pytest.raises(ValidationError, match="non-empty argv"):
        MCPServer(command=[])
    with pytest.raises(ValidationError, match="http:// or https://"):
        MCPServer(url="localhost:8000/mcp")


# --- conversions ----------------------------------------------------------------------------------


def test_openai_names_are_safe_unique_and_keep_safe_names() -> None:
    long = "x" * 70
    names = openai_names(["a.b", "a_b", "a/b", "ok-name", long, "x" * 64, "ünï"])
    assert names["a_b"] == "a_b" and names["ok-name"] == "ok-name" and names["x" * 64] == "x" * 64
    assert names["a.b"] == "a_b_2" and names["a/b"] == "a_b_3"
    assert names[long] == "x" * 62 + "_2" and names["ünï"] == "_n_"
    assert len(set(names.values())) == len(names)
    assert all(len(alias) <= 64 and alias.replace("_", "").replace("-", "").isalnum() for alias in names.values())


def test_openai_tool_keeps_the_schema_and_adds_a_missing_type() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string", "enum": ["a", "b"]}}, "required": ["q"]}
    tool = types.Tool(name="search.web", description="Search.", input_schema=schema)
    assert openai_tool(tool, "search_web") == {
        "type": "function",
        "function": {"name": "search_web", "description": "Search.", "parameters": schema},
    }
    bare = types.Tool(name="now", title="Now", input_schema={"properties": {}})
    assert openai_tool(bare, "now")["function"] == {
        "name": "now",
        "description": "Now",
        "parameters": {"type": "object", "properties": {}},
    }


def test_results_become_text_with_placeholders_for_binary_parts() -> None:
    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="hello"),
            types.ImageContent(type="image", data="aGVsbG8=", mime_type="image/png"),
            types.AudioContent(type="audio", data="AAAA", mime_type="audio/wav"),
            types.EmbeddedResource(
                type="resource", resource=types.TextResourceContents(uri="file:///a.txt", text="file text")
            ),
            types.EmbeddedResource(
                type="resource",
                resource=types.BlobResourceContents(uri="file:///b.bin", blob="AAE=", mime_type="application/x"),
            ),
            types.ResourceLink(type="resource_link", name="doc", uri="file:///doc.md"),
        ]
    )
    assert result_text(result).splitlines() == [
        "hello",
        "[image: image/png, 5 bytes]",
        "[audio: audio/wav, 3 bytes]",
        "file text",
        "[resource: file:///b.bin, application/x, 2 bytes]",
        "[resource link: doc file:///doc.md]",
    ]
    assert result_text(types.CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'


# --- real servers ---------------------------------------------------------------------------------


async def test_kv_server_over_stdio_tools_state_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KV_TEST_PARENT", "inherited")
    async with kv_server(env={"KV_TEST_SETTING": "on"}).session() as session:
        assert session.server_name == "kv" and "key-value store" in (session.instructions or "")
        assert [tool.name for tool in session.tools] == KV_TOOLS
        aliases = [tool["function"]["name"] for tool in session.openai_tools()]
        assert aliases == ["put", "get", "keys", "kv_size", "slow", "setting", "crash"]
        assert session.mcp_name("kv_size") == "kv.size" and session.mcp_name("kv.size") == "kv.size"
        with pytest.raises(KeyError, match="has no tool 'nope'"):
            session.mcp_name("nope")

        put = await session.call_tool("put", {"key": "a", "value": "1"})
        assert (put.content, put.is_error, put.structured) == ("stored a", False, {"result": "stored a"})
        assert put.message("call_1") == {"role": "tool", "tool_call_id": "call_1", "content": "stored a"}
        assert (await session.call_tool("get", '{"key": "a"}')).content == "1"
        size = await session.call_tool("kv_size")
        assert (size.name, size.content) == ("kv.size", "1")

        missing = await session.call_tool("get", {"key": "zz"})
        assert missing.is_error and missing.content == "Error: Error executing tool get: no such key: zz"
        assert missing.error == "Error executing tool get: no such key: zz"  # the server's own text
        invalid = await session.call_tool("put", {"key": "a"})  # the server validates: value is missing
        assert invalid.is_error and "value" in invalid.content
        unknown = await session.call_tool("delete", {"key": "a"})
        assert unknown.is_error and unknown.content.startswith("Error: unknown tool 'delete'; available tools: put")
        not_json = await session.call_tool("get", '{"key": ')
        assert not_json.is_error and "not valid JSON" in not_json.content and not_json.arguments == '{"key": '
        not_object = await session.call_tool("get", "[1, 2]")
        assert not_object.is_error and "must be a JSON object, got list" in not_object.content

        assert (await session.call_tool("setting", {"name": "KV_TEST_SETTING"})).content == "on"
        inherited = await session.call_tool("setting", {"name": "KV_TEST_PARENT"})  # env goes over os.environ
        assert inherited.content == "inherited"
        assert await session.list_resources() == [] and await session.list_prompts() == []
        assert [tool.name for tool in await session.list_tools()] == KV_TOOLS


async def test_mcp_server_time_over_stdio() -> None:
    async with MCPServer(command=TIME_COMMAND).session() as session:
        assert session.server_name == "mcp-time"
        assert {tool.name for tool in session.tools} == {"get_current_time", "convert_time"}
        result = await session.call_tool("get_current_time", {"timezone": "Asia/Tokyo"})
        assert not result.is_error and json.loads(result.content)["timezone"] == "Asia/Tokyo"
        bad = await session.call_tool("get_current_time", {"timezone": "Mars/Olympus"})
        assert bad.is_error and bad.content.startswith("Error: ")


async def test_mcp_server_calculator_from_pypi_in_its_own_venv(calculator_command: list[str]) -> None:  # noqa: F811
    async with MCPServer(command=calculator_command).session() as session:
        assert session.server_name == "calculator" and [tool.name for tool in session.tools] == ["calculate"]
        result = await session.call_tool("calculate", {"expression": "2*(3+4)"})
        assert (result.content, result.is_error) == ("14", False)


async def test_tools_of_every_server_are_accepted_by_openai_and_langchain(scripted, calculator_command) -> None:  # noqa: F811
    from langchain_openai import ChatOpenAI

    async def tools_of(server: MCPServer) -> list[dict]:
        async with server.session() as session:
            return session.openai_tools()

    servers = [kv_server(), MCPServer(command=TIME_COMMAND), MCPServer(command=calculator_command)]
    for tools in await asyncio.gather(*(tools_of(server) for server in servers)):
        client = openai.AsyncOpenAI(base_url=scripted.base_url, api_key="x")
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools)
        await client.close()
        llm = ChatOpenAI(model="m", base_url=scripted.base_url, api_key="x").bind_tools(tools)
        await llm.ainvoke("hi")
        assert scripted.requests[-2]["tools"] == tools and scripted.requests[-1]["tools"] == tools


# --- recording ----------------------------------------------------------------------------------


async def test_tool_calls_are_recorded_between_the_model_turns(scripted) -> None:
    scripted.replies = [
        {"content": None, "tool_calls": [call("c1", "put", key="a", value="1"), call("c2", "get", key="zz")]},
        {"content": None, "tool_calls": [call("c3", "kv_size")]},
        "Stored a.",
    ]
    client = Model(name="agent", inference_base_url=scripted.base_url).openai_client()
    async with kv_server().session() as session:
        outside = await session.call_tool("put", {"key": "outside", "value": "0"})
        assert not outside.is_error  # ran, but no rollout is open: nothing to record into
        async with rollout(task="kv") as traj:
            messages: list = [{"role": "user", "content": "Store a=1."}]
            while True:
                reply = await client.chat.completions.create(
                    model="agent", messages=messages, tools=session.openai_tools()
                )
                message = reply.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    break
                messages += await session.run_tool_calls(message.tool_calls)
    await client.close()

    assert messages[2:4] == [
        {"role": "tool", "tool_call_id": "c1", "content": "stored a"},
        {"role": "tool", "tool_call_id": "c2", "content": "Error: Error executing tool get: no such key: zz"},
    ]
    assert messages[5] == {"role": "tool", "tool_call_id": "c3", "content": "2"}  # "outside" and "a"
    put, get, size = traj.tool_calls
    assert (put.name, put.arguments, put.result, put.error) == ("put", {"key": "a", "value": "1"}, "stored a", None)
    assert (put.tool_call_id, put.span, put.after_turn) == ("c1", "mcp:kv/put", 1)
    assert put.duration_s > 0
    assert (get.name, get.error, get.span) == ("get", "Error executing tool get: no such key: zz", "mcp:kv/get")
    assert (size.name, size.tool_call_id, size.span, size.after_turn) == ("kv.size", "c3", "mcp:kv/kv.size", 2)
    kinds = [type(event).__name__ for event in traj.timeline()]
    assert kinds == ["Turn", "ToolCallRecord", "ToolCallRecord", "Turn", "ToolCallRecord", "Turn"]
    assert isinstance(traj.timeline()[0], Turn) and isinstance(traj.timeline()[1], ToolCallRecord)
    assert [m.role for m in traj.messages] == ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]


async def test_run_tool_calls_accepts_sdk_objects_dicts_and_our_tool_calls() -> None:
    from openai.types.chat import ChatCompletionMessageToolCall

    sdk = ChatCompletionMessageToolCall.model_validate(call("s", "put", key="k", value="v"))
    ours = ToolCall.model_validate(call("o", "get", key="k"))
    langchain = {"id": "l", "name": "keys", "args": {}}
    async with kv_server().session() as session:
        messages = await session.run_tool_calls([sdk, ours, langchain])
    assert [(m["tool_call_id"], m["content"]) for m in messages] == [("s", "stored k"), ("o", "v"), ("l", "k")]


# --- isolation ------------------------------------------------------------------------------------


async def isolated_rollouts(server: MCPServer, count: int = 8) -> list:
    async def one(n: int) -> tuple:
        async with server.session() as session, rollout() as traj:
            await session.call_tool("put", {"key": f"k{n}", "value": str(n)})
            return (await session.call_tool("keys")).content, traj, session.pid

    return await asyncio.gather(*(one(n) for n in range(count)))


async def test_concurrent_rollouts_get_their_own_stdio_server() -> None:
    results = await isolated_rollouts(kv_server())
    assert [keys for keys, _, _ in results] == [f"k{n}" for n in range(8)]
    assert [[c.arguments.get("key") for c in traj.tool_calls] for _, traj, _ in results] == [
        [f"k{n}", None] for n in range(8)
    ]
    pids = {pid for _, _, pid in results}
    assert len(pids) == 8 and all(gone(pid) for pid in pids)


async def test_concurrent_rollouts_get_their_own_http_session(kv_http: str) -> None:  # noqa: F811
    server = MCPServer(url=kv_http, headers={"Authorization": "Bearer t0k"})
    results = await isolated_rollouts(server)
    assert [keys for keys, _, _ in results] == [f"k{n}" for n in range(8)]
    assert all(pid is None for _, _, pid in results)
    async with server.session() as session:
        assert session.server_name == "kv" and "key-value store" in (session.instructions or "")
        assert (await session.call_tool("setting", {"name": "Authorization"})).content == "Bearer t0k"


async def test_a_shared_session_is_opened_once_and_closed_by_aclose() -> None:
    server = kv_server(shared=True)
    async with server:
        async with server.session() as first:
            await first.call_tool("put", {"key": "a", "value": "1"})
        async with server.session() as second:
            assert second is first and (await second.call_tool("get", {"key": "a"})).content == "1"
        pid = first.pid
        assert pid is not None and psutil.Process(pid).is_running() and not first.closed
    assert first.closed and gone(pid)
    async with server.session() as reopened:  # after aclose, a new one
        assert reopened is not first and (await reopened.call_tool("keys")).structured == {"result": []}
    await server.aclose()
    with pytest.raises(MCPError, match="the session to MCP server 'kv' is closed"):
        await reopened.call_tool("keys")


# --- bad input ------------------------------------------------------------------------------------


async def test_a_command_that_does_not_exist() -> None:
    with pytest.raises(MCPError, match="command 'no-such-mcp-server' not found; install it or check PATH"):
        async with MCPServer(command=["no-such-mcp-server", "--x"]).session():
            pass


async def test_a_missing_command_stops_a_gather_at_once_instead_of_counting_each_rollout() -> None:
    missing = MCPServer(command=["no-such-mcp-server"])

    async def attempt() -> Trajectory:
        async with rollout() as traj, missing.session():
            pass
        return traj

    groups = [TrajectoryGroup(attempt() for _ in range(4)) for _ in range(3)]
    with pytest.raises(MCPUnreachable, match="command 'no-such-mcp-server' not found") as raised:
        await gather_trajectory_groups(groups, max_exceptions=100, pbar_desc=None)  # not 12 errors within budget
    assert isinstance(raised.value, SetupError)


async def test_a_server_that_exits_before_initializing_shows_its_stderr() -> None:
    code = "import sys; print('boom: API_KEY is not set', file=sys.stderr); sys.exit(2)"
    with pytest.raises(MCPError, match=r"(?s)exited before it finished starting \(exit code 2\).*API_KEY is not set"):
        async with MCPServer(command=[sys.executable, "-c", code], name="keyless").session():
            pass


async def test_a_server_that_never_answers_hits_the_connect_timeout() -> None:
    silent = MCPServer(command=[sys.executable, "-c", "import time; time.sleep(3600)"], connect_timeout_s=0.5)
    with pytest.raises(MCPError, match=r"did not finish starting within connect_timeout_s=0.5s"):
        async with asyncio.timeout(120), silent.session():  # not waiting for the server's hour
            pass


async def test_a_refused_url_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(MCPError, match=f"cannot connect to {url}"):
        async with MCPServer(url=url, connect_timeout_s=5).session():
            pass


async def test_an_invalid_input_schema_names_the_tool() -> None:
    with pytest.raises(
        MCPSchemaError, match=r"tool 'broken' has an invalid inputSchema: 12 is not valid.*properties/x"
    ):
        async with MCPServer(command=BAD_SCHEMA_COMMAND).session():
            pass


async def test_a_tool_past_its_timeout_is_an_error_result_and_the_session_goes_on() -> None:
    async with kv_server(tool_timeout_s=0.5).session() as session:
        async with asyncio.timeout(120):  # not waiting for the tool's hour
            result = await session.call_tool("slow", {"seconds": 3600})
        assert result.is_error and result.content == "Error: tool 'slow' timed out after 0.5s (tool_timeout_s)"
        assert (await session.call_tool("slow", {"seconds": 0.1}, timeout_s=60)).content == "slept 0.1"
        assert (await session.call_tool("put", {"key": "a", "value": "1"}, timeout_s=60)).content == "stored a"


async def test_a_stdio_server_that_dies_mid_rollout_fails_the_rollout() -> None:
    async with kv_server().session() as session:
        with pytest.raises(RolloutFailed) as failed:
            async with rollout() as traj:
                await session.call_tool("put", {"key": "a", "value": "1"})
                await session.call_tool("crash")
        assert isinstance(failed.value.cause, MCPError)
        message = str(failed.value.cause)
        assert message.startswith("MCP server 'kv' (") and "exited during the session" in message
        assert "exit code 3" in message
        assert traj.failed and [c.name for c in traj.tool_calls] == ["put", "crash"]
        assert traj.tool_calls[1].error == message
        with pytest.raises(MCPError, match="exited during the session"):
            await session.call_tool("keys")
    assert gone(session.pid)


async def test_an_http_server_that_dies_raises_on_that_call_or_the_next() -> None:
    with kv_http_server() as url:
        async with MCPServer(url=url, tool_timeout_s=5).session() as session:
            assert (await session.call_tool("put", {"key": "a", "value": "1"})).content == "stored a"
            with pytest.raises(MCPError, match=f"MCP server 'kv' \\({url}\\) exited during the session"):
                await session.call_tool("crash")
                await session.call_tool("keys")


# --- cleanup --------------------------------------------------------------------------------------


async def test_a_rollout_cancelled_mid_call_closes_the_session_and_the_process() -> None:
    opened: list = []

    async def agent() -> None:
        async with kv_server().session() as session, rollout():
            opened.append(session)
            await session.call_tool("slow", {"seconds": 30})

    task = asyncio.create_task(agent())
    while not opened:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # inside the slow call
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert opened[0].closed and gone(opened[0].pid, within_s=10)  # not at the end of the 30 s call


PARENT = textwrap.dedent(
    """
    import asyncio, sys
    from art_agents.integrations.mcp import MCPServer

    async def main():
        async with MCPServer(command=sys.argv[1:]).session() as session:
            print(session.pid, flush=True)
            await asyncio.sleep(120)

    asyncio.run(main())
    """
)


def test_a_parent_killed_with_sigkill_leaves_no_orphan_server(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parents = [
        subprocess.Popen([sys.executable, str(script), *command], stdout=subprocess.PIPE, text=True)
        for command in (KV_COMMAND, TIME_COMMAND)
    ]
    pids = [int(parent.stdout.readline()) for parent in parents if parent.stdout is not None]
    assert len(pids) == 2 and all(psutil.Process(pid).is_running() for pid in pids)
    for parent in parents:
        parent.kill()
        parent.wait(timeout=10)
    assert [gone(pid) for pid in pids] == [True, True], "a server outlived its killed parent"


# --- end to end with the art-agents server ----------------------------------------------------------


async def test_a_model_on_the_real_server_uses_the_kv_tools_and_trains(tiny_model_path: Path, tmp_path: Path) -> None:
    from server_fixtures import start_server

    from art_agents import ModelConfig, RemoteBackend, TrainableModel, TrainConfig, TrajectoryGroup

    texts = [hermes("put", key="a", value="1"), "Stored a=1."]
    config = ModelConfig(engine="scripted", scripted_responses=texts, default_max_tokens=64)
    with start_server(tmp_path / "art") as url:
        backend = RemoteBackend(url)
        model = TrainableModel(name="kv-agent", project="mcp", base_model=str(tiny_model_path), config=config)
        await model.register(backend)
        client = model.openai_client()
        server = kv_server()
        trajectories = []
        for reward in (1.0, 0.0):
            async with server.session() as session:
                async with rollout() as traj:
                    messages: list = [{"role": "user", "content": "Store a=1 in the store."}]
                    first = await client.chat.completions.create(
                        model=model.name, messages=messages, tools=session.openai_tools()
                    )
                    assistant = first.choices[0].message
                    assert [c.function.name for c in assistant.tool_calls or []] == ["put"]
                    messages.append(assistant.model_dump(exclude_none=True))
                    messages += await session.run_tool_calls(assistant.tool_calls)
                    final = await client.chat.completions.create(
                        model=model.name, messages=messages, tools=session.openai_tools()
                    )
                    assert final.choices[0].message.content == "Stored a=1."
                traj.reward = reward
                trajectories.append(traj)
                assert (await session.call_tool("get", {"key": "a"})).content == "1"  # the tool really ran

        traj = trajectories[0]
        assert [m.role for m in traj.messages] == ["user", "assistant", "tool", "assistant"]
        assert traj.messages[2].content == "stored a"
        assert [type(e).__name__ for e in traj.timeline()] == ["Turn", "ToolCallRecord", "Turn"]
        assert traj.tool_calls[0].span == "mcp:kv/put" and traj.tool_calls[0].arguments == {"key": "a", "value": "1"}
        assert all(t.completion_id and t.policy_step == 0 for t in traj.turns)

        result = await model.train([TrajectoryGroup(trajectories)], TrainConfig(), progress=False)
        assert result.step == 1 and result.metrics["turns_retokenized"] == 0
        await client.close()
        await backend.close()

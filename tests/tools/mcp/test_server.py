"""McpServer lifecycle and failures, against real MCP servers over stdio (the SDK's FastMCP, and a
hand-written one that misbehaves on purpose)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from agentflow.errors import ConfigError, ToolTimeoutError
from agentflow.tools.mcp.connection import STDERR_MAX_BYTES, Connection, stderr_file
from agentflow.tools.mcp.runtime import get_runtime
from agentflow.tools.mcp.server import McpServerError, start_servers
from tests.tools.mcp.conftest import fastmcp_config, raw_config


async def pid_of(server) -> int:
    result = await server.call_tool("pid", {}, 20)
    return int(result.content[0].text)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_concurrent_calls_share_one_started_server(make_server):
    server = make_server("fast", fastmcp_config())
    tools = await server.astart()
    assert {"add", "echo", "pid", "die"} <= {tool.name for tool in tools}
    pids = await asyncio.gather(*(pid_of(server) for _ in range(6)))
    assert len(set(pids)) == 1 and server.starts == 1
    result = await server.call_tool("add", {"a": 2, "b": 3}, 20)
    assert result.structuredContent == {"total": 5}


async def test_calls_from_separate_event_loops_reach_the_same_server(make_server):
    server = make_server("fast", fastmcp_config())
    first = await pid_of(server)
    second = await asyncio.to_thread(asyncio.run, pid_of(server))  # another thread, another loop
    assert first == second and server.starts == 1


async def test_the_concurrency_limit_queues_calls(make_server):
    one = make_server("one", fastmcp_config(max_concurrency=1))
    two = make_server("two", fastmcp_config(max_concurrency=2))
    for server in (one, two):
        await server.astart()

    async def two_sleeps(server) -> float:
        start = time.perf_counter()
        await asyncio.gather(*(server.call_tool("sleep", {"seconds": 1.0}, 20) for _ in range(2)))
        return time.perf_counter() - start

    assert await two_sleeps(one) >= 2.0
    assert await two_sleeps(two) < 1.9


async def test_a_server_that_dies_mid_call_fails_that_call_and_restarts_on_the_next(make_server):
    server = make_server("fast", fastmcp_config())
    before = await pid_of(server)
    start = time.perf_counter()
    with pytest.raises(McpServerError, match="closed the connection.*during the call to 'die'.*restarted"):
        await server.call_tool("die", {}, 30)
    assert time.perf_counter() - start < 10  # noticed at once, not at the timeout
    after = await pid_of(server)
    assert after != before and not alive(before) and server.starts == 2


async def test_a_call_past_its_timeout_is_a_tool_timeout_and_the_server_stays_up(make_server):
    server = make_server("fast", fastmcp_config())
    before = await pid_of(server)
    start = time.perf_counter()
    with pytest.raises(ToolTimeoutError, match="no answer to the call to 'sleep' within 0.5s"):
        await server.call_tool("sleep", {"seconds": 30}, 0.5)
    assert time.perf_counter() - start < 5
    assert (await server.call_tool("echo", {"text": "still here"}, 20)).content[0].text == "still here"
    assert await pid_of(server) == before


async def test_aclose_stops_the_process_and_a_later_call_starts_a_new_one(make_server):
    server = make_server("fast", fastmcp_config())
    before = await pid_of(server)
    await server.aclose()
    await server.aclose()  # idempotent
    assert not alive(before)
    assert await pid_of(server) != before


async def test_a_call_that_gives_up_while_the_server_starts_leaves_the_start_to_the_next_call(make_server):
    server = make_server("slow", raw_config("slow-start"))
    with pytest.raises(ToolTimeoutError):
        await server.call_tool("ping", {}, 0.5)
    assert (await server.call_tool("ping", {}, 20)).content[0].text == "pong"
    assert server.starts == 1


def test_servers_start_in_parallel_and_failures_are_reported_per_server(make_server):
    good = make_server("good", fastmcp_config())
    bad = make_server("bad", raw_config("exit-at-start"))
    results = start_servers([good, bad])
    assert not isinstance(results["good"], BaseException)
    assert isinstance(results["bad"], ConfigError)


# -- servers that misbehave ----------------------------------------------------------------------------


def test_a_server_that_exits_at_start_is_a_config_error_with_its_stderr(make_server):
    server = make_server("locked", raw_config("exit-at-start"))
    start = time.perf_counter()
    error = start_servers([server])["locked"]
    assert isinstance(error, ConfigError)
    assert "'locked'" in str(error) and "exited" in str(error) and "database file is locked" in str(error)
    assert time.perf_counter() - start < 10


def test_a_server_that_never_answers_at_start_is_cut_off_by_the_startup_timeout(make_server):
    server = make_server("mute", raw_config("hang", startup_timeout_s=1.0))
    start = time.perf_counter()
    error = start_servers([server])["mute"]
    assert isinstance(error, ConfigError) and "within 1s" in str(error)
    assert time.perf_counter() - start < 10


def test_a_command_that_does_not_exist_is_named(make_server):
    server = make_server("ghost", fastmcp_config().model_copy(update={"command": "/no/such/mcp-server"}))
    error = start_servers([server])["ghost"]
    assert isinstance(error, ConfigError) and "could not run '/no/such/mcp-server'" in str(error)


async def test_a_server_that_exits_when_called_fails_the_call_at_once_with_its_last_words(make_server):
    server = make_server("fragile", raw_config("die-mid-call"))
    start = time.perf_counter()
    with pytest.raises(McpServerError, match="during the call to 'ping'.*stderr ends with: segfault in ping"):
        await server.call_tool("ping", {}, 30)
    assert time.perf_counter() - start < 10


async def test_a_server_that_writes_invalid_json_rpc_fails_the_call_naming_it(make_server):
    server = make_server("noisy", raw_config("garbage"))
    await server.astart()
    with pytest.raises(ToolTimeoutError, match="1 malformed message"):
        await server.call_tool("ping", {}, 1.0)


async def test_a_result_of_the_wrong_shape_is_a_clear_server_error(make_server):
    server = make_server("sloppy", raw_config("bad-result"))
    with pytest.raises(McpServerError, match="malformed result.*content"):
        await server.call_tool("ping", {}, 20)


def test_a_chatty_servers_stderr_is_cut_to_its_tail():
    stderr = stderr_file("chatty")
    conn = Connection(runtime=get_runtime(), ready=asyncio.Future(loop=get_runtime().loop), stderr=stderr)
    os.write(stderr.fileno(), b"x" * STDERR_MAX_BYTES + b"\nlast words\n")
    conn.trim_stderr()
    os.write(stderr.fileno(), b"after the cut\n")  # still appended at the end
    assert os.fstat(stderr.fileno()).st_size < 4096
    assert conn.stderr_tail().endswith("last words\nafter the cut")
    stderr.close()

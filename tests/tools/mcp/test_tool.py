"""Flow tools made from MCP servers: cards from what the server advertises, SERVER.TOOL names, tool selection."""

from __future__ import annotations

import pytest

from agentflow.errors import ConfigError, ToolError, ToolInputError
from agentflow.executor import fallback_field
from agentflow.tools.base import ToolContext
from agentflow.tools.mcp.server import stop_servers
from agentflow.tools.mcp.tool import McpTool, mcp_tools
from tests.tools.mcp.conftest import fastmcp_config, raw_config


def stop(tools: dict[str, McpTool]) -> None:
    stop_servers(list({id(tool.server): tool.server for tool in tools.values()}.values()))


@pytest.fixture
def fast_tools():
    tools = mcp_tools({"calc": fastmcp_config(include=["add", "echo", "picture", "fail"])})
    yield tools
    stop(tools)


def test_cards_come_from_what_the_server_advertises(fast_tools):
    assert sorted(fast_tools) == ["calc.add", "calc.echo", "calc.fail", "calc.picture"]
    add = fast_tools["calc.add"]
    card = add.card()
    assert card["name"] == "calc.add" and card["description"] == "Add two integers."
    assert card["input_schema"]["required"] == ["a", "b"]
    assert card["server"] == "calc" and card["transport"] == "stdio" and card["mcp_name"] == "add"
    assert card["output"] == "Text, and a JSON object with total (integer)."
    assert fast_tools["calc.picture"].card()["output"].startswith("What the MCP server 'calc' returns: text")
    assert add.executor_schema() == card["input_schema"]
    assert fallback_field(fast_tools["calc.echo"]) == "text" and fallback_field(add) is None


async def test_arguments_are_validated_before_the_call_and_results_converted(fast_tools):
    add, picture, fail = fast_tools["calc.add"], fast_tools["calc.picture"], fast_tools["calc.fail"]
    with pytest.raises(ToolInputError, match="'b' is a required property"):
        add.parse_input({"a": 1})
    with pytest.raises(ToolInputError, match="a: 'one' is not of type 'integer'"):
        add.parse_input({"a": "one", "b": 2})
    result = await add.run(add.parse_input({"a": 20, "b": 22}), ToolContext(timeout_s=20))
    assert result.data["structured"] == {"total": 42} and '"total": 42' in result.output
    shown = await picture.run({}, ToolContext(timeout_s=20))
    assert shown.output.splitlines()[1].startswith("[image: image/png, 100 bytes]")
    with pytest.raises(ToolError, match="calc.fail reported an error: .*out of cheese"):
        await fail.run(fail.parse_input({"message": "out of cheese"}), ToolContext(timeout_s=20))


def test_exclude_and_include_pick_tools():
    tools = mcp_tools({"calc": fastmcp_config(exclude=["die", "sleep", "pid", "picture", "fail", "header"])})
    stop(tools)
    assert sorted(tools) == ["calc.add", "calc.echo"]
    with pytest.raises(ConfigError, match="include names tools it does not offer: ad; it offers: add, echo"):
        mcp_tools({"calc": fastmcp_config(include=["ad"])})


def test_a_tool_with_an_invalid_schema_is_a_config_error_that_says_how_to_leave_it_out():
    with pytest.raises(ConfigError, match=r"invalid input schema for tool 'broken'.*'zero' is not of type.*"
                                          r"exclude: \[broken\]"):
        mcp_tools({"raw": raw_config("bad-schema")})
    tools = mcp_tools({"raw": raw_config("bad-schema", exclude=["broken"])})
    stop(tools)
    assert list(tools) == ["raw.ping"]


def test_two_servers_with_tools_of_the_same_name_do_not_collide_and_a_failed_start_stops_the_others():
    with pytest.raises(ConfigError, match="'b' .*exited"):
        mcp_tools({"a": fastmcp_config(include=["echo"]), "b": raw_config("exit-at-start")})
    tools = mcp_tools({"a": fastmcp_config(include=["echo"]), "b": fastmcp_config(include=["echo"])})
    stop(tools)
    assert sorted(tools) == ["a.echo", "b.echo"]
    assert tools["a.echo"].server is not tools["b.echo"].server


def test_servers_behind_given_tools_are_shared_not_started_again():
    first = mcp_tools({"calc": fastmcp_config(include=["echo"])})
    try:
        assert mcp_tools({"calc": fastmcp_config(include=["echo"])}, given=first) == {}
        assert first["calc.echo"].server.starts == 1
    finally:
        stop(first)

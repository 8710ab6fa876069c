"""A streamable-HTTP MCP server on 127.0.0.1 (the SDK's FastMCP): headers, a server that goes away and comes back."""

from __future__ import annotations

import pytest

from agentflow.errors import ConfigError
from agentflow.tools.base import ToolContext
from agentflow.tools.mcp.config import McpHttpServerConfig
from agentflow.tools.mcp.server import McpServerError
from agentflow.tools.mcp.tool import mcp_tools
from tests.servers import closed_port

CTX = ToolContext(timeout_s=20)


async def test_tools_over_http_with_headers_from_the_environment(http_mcp_server, monkeypatch):
    monkeypatch.setenv("AF_TEST_TOKEN", "s3cret")
    config = http_mcp_server.config(include=["add", "header"], headers={"Authorization": "Bearer ${AF_TEST_TOKEN}"})
    tools = mcp_tools({"web": config})
    try:
        assert sorted(tools) == ["web.add", "web.header"] and tools["web.add"].card()["transport"] == "http"
        added = await tools["web.add"].run({"a": 2, "b": 40}, CTX)
        assert added.data["structured"] == {"total": 42}
        shown = await tools["web.header"].run({"name": "authorization"}, CTX)
        assert shown.output == "Bearer s3cret"
    finally:
        await tools["web.add"].aclose()


async def test_a_server_that_goes_away_fails_the_call_and_is_reconnected_when_back(http_mcp_server):
    tools = mcp_tools({"web": http_mcp_server.config(include=["pid"])})
    pid = tools["web.pid"]
    try:
        first = (await pid.run({}, CTX)).output
        http_mcp_server.kill()
        with pytest.raises(McpServerError, match="MCP server 'web'.*(ConnectError|connection)"):
            await pid.run({}, CTX)
        http_mcp_server.start()
        second = (await pid.run({}, CTX)).output
        assert second != first and pid.server.starts == 2
    finally:
        await pid.aclose()


def test_a_url_where_nothing_listens_is_a_config_error():
    url = f"http://127.0.0.1:{closed_port()}/mcp"
    with pytest.raises(ConfigError, match=f"MCP server 'web' \\({url}\\) failed to start: ConnectError"):
        mcp_tools({"web": McpHttpServerConfig(url=url, startup_timeout_s=5)})

"""MCP server settings in the flow config."""

from __future__ import annotations

import pytest

from agentflow.config import FlowConfig
from agentflow.errors import ConfigError
from agentflow.tools.mcp.config import McpHttpServerConfig, McpStdioServerConfig


def test_stdio_and_http_servers_are_told_apart_by_command_or_url():
    config = FlowConfig.from_dict({"tools": {}, "mcp_servers": {
        "time": {"command": "mcp-server-time", "args": ["--local-timezone", "UTC"], "include": ["get_current_time"]},
        "search": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}, "max_concurrency": 8},
    }})
    assert isinstance(config.mcp_servers["time"], McpStdioServerConfig)
    assert isinstance(config.mcp_servers["search"], McpHttpServerConfig)
    assert FlowConfig.from_dict(config.model_dump()) == config  # survives the CLI's dump-and-reload


@pytest.mark.parametrize(("servers", "message"), [
    ({"t": {}}, "either 'command' (stdio) or 'url'"),
    ({"t": {"command": "x", "url": "http://h/mcp"}}, "either 'command' (stdio) or 'url'"),
    ({"a.b": {"command": "x"}}, "String should match pattern"),
    ({"t": {"url": "ftp://h/mcp"}}, "url must start with http:// or https://"),
    ({"t": {"command": "x", "headers": {}}}, "unknown key mcp_servers.t.stdio.headers"),
    ({"t": {"command": "x", "max_concurrency": 0}}, "greater than or equal to 1"),
])
def test_bad_server_settings_are_config_errors(servers, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        FlowConfig.from_dict({"mcp_servers": servers})


def test_a_flow_may_have_only_mcp_tools_but_not_none_at_all():
    FlowConfig.from_dict({"tools": {}, "mcp_servers": {"t": {"command": "x"}}})
    with pytest.raises(ConfigError, match="no tools enabled"):
        FlowConfig.from_dict({"tools": {}})


def test_environment_references_are_resolved_when_the_server_starts(monkeypatch):
    stdio = McpStdioServerConfig(command="x", env={"TOKEN": "${AF_TEST_TOKEN}", "PLAIN": "a$b"})
    http = McpHttpServerConfig(url="http://h/mcp", headers={"Authorization": "Bearer ${AF_TEST_TOKEN}"})
    monkeypatch.setenv("AF_TEST_TOKEN", "s3cret")
    assert stdio.resolved_env() == {"TOKEN": "s3cret", "PLAIN": "a$b"}
    assert http.resolved_headers() == {"Authorization": "Bearer s3cret"}
    monkeypatch.delenv("AF_TEST_TOKEN")
    with pytest.raises(ConfigError, match="header Authorization refers to environment variable AF_TEST_TOKEN"):
        http.resolved_headers()

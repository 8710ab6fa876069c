"""The published reference servers from PyPI (`mcp-server-time`, `mcp-server-sqlite`, in the dev extra), started
over stdio as a user would configure them. No network."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentflow.errors import ToolError, ToolInputError
from agentflow.tools.base import ToolContext
from agentflow.tools.mcp.config import McpStdioServerConfig
from agentflow.tools.mcp.tool import mcp_tools

CTX = ToolContext(timeout_s=30)
BIN = Path(sys.executable).parent


def console_script(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed next to {sys.executable}: pip install -e '.[dev]'")
    return str(path)


async def test_mcp_server_time():
    config = McpStdioServerConfig(command=console_script("mcp-server-time"), args=["--local-timezone", "UTC"])
    tools = mcp_tools({"time": config})
    try:
        assert sorted(tools) == ["time.convert_time", "time.get_current_time"]
        convert = tools["time.convert_time"]
        assert "IANA timezone name" in str(convert.card()["input_schema"])
        # zones without daylight saving time, so the answer holds all year
        arguments = convert.parse_input({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"})
        result = await convert.run(arguments, CTX)
        assert "21:00" in result.output and result.data["server"] == "time"
        with pytest.raises(ToolInputError, match="'target_timezone' is a required property"):
            convert.parse_input({"source_timezone": "UTC", "time": "12:00"})
        now = tools["time.get_current_time"]
        with pytest.raises(ToolError, match="reported an error: .*Nowhere/Atlantis"):
            await now.run(now.parse_input({"timezone": "Nowhere/Atlantis"}), CTX)
    finally:
        await tools["time.convert_time"].aclose()


async def test_mcp_server_sqlite(tmp_path):
    config = McpStdioServerConfig(command=console_script("mcp-server-sqlite"),
                                  args=["--db-path", str(tmp_path / "agents.db")], exclude=["append_insight"])
    tools = mcp_tools({"db": config})
    try:
        assert sorted(tools) == ["db.create_table", "db.describe_table", "db.list_tables", "db.read_query",
                                 "db.write_query"]

        async def call(name: str, **arguments: str):
            tool = tools[f"db.{name}"]
            return await tool.run(tool.parse_input(arguments), CTX)

        await call("create_table", query="CREATE TABLE agents (name TEXT, code TEXT)")
        await call("write_query", query="INSERT INTO agents VALUES ('falcon', 'ZX-4417')")
        rows = await call("read_query", query="SELECT code FROM agents WHERE name = 'falcon'")
        assert "ZX-4417" in rows.output
        assert "agents" in (await call("list_tables")).output
        # this server reports SQL errors as ordinary text, not with isError: the planner still reads them
        assert "no such table: missing" in (await call("read_query", query="SELECT * FROM missing")).output
    finally:
        await tools["db.read_query"].aclose()

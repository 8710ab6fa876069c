"""`agentflow tool list` and `agentflow tool run` with the MCP servers of a config."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from agentflow.cli import app
from tests.tools.mcp.conftest import fastmcp_config


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "flow.yaml"
    server = fastmcp_config(include=["add", "echo"]).model_dump()
    path.write_text(yaml.safe_dump({"tools": {"python": {}}, "mcp_servers": {"calc": server}}))
    return path


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_tool_list_shows_mcp_tools_with_their_server(config_file):
    result = run("tool", "list", "--json", "--config", str(config_file))
    assert result.exit_code == 0, result.output
    cards = {card["name"]: card for card in json.loads(result.output)}
    assert cards["calc.add"]["server"] == "calc" and cards["calc.add"]["description"] == "Add two integers."
    assert "python" in cards and "server" not in cards["python"]
    table = run("tool", "list", "--config", str(config_file))
    assert table.exit_code == 0 and "calc.echo" in table.output and "(built-in)" in table.output


def test_tool_run_calls_one_mcp_tool(config_file):
    result = run("tool", "run", "calc.add", "--input", '{"a": 1, "b": 2}', "--config", str(config_file))
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["tool"] == "calc.add" and shown["data"]["structured"] == {"total": 3}


@pytest.mark.parametrize(("name", "arguments", "kind", "message"), [
    ("calc.add", '{"a": 1}', "tool_input", "'b' is a required property"),
    ("calc.sub", "{}", "unknown_tool", "'calc' offers: calc.add, calc.echo"),
])
def test_tool_run_errors_are_json(config_file, name, arguments, kind, message):
    result = run("tool", "run", name, "--input", arguments, "--config", str(config_file))
    assert result.exit_code == 1
    error = json.loads(result.output)["error"]
    assert error["kind"] == kind and message in error["message"]


def test_a_server_that_cannot_start_is_a_clear_error(tmp_path):
    path = tmp_path / "flow.yaml"
    path.write_text(yaml.safe_dump({"mcp_servers": {"ghost": {"command": "/no/such/mcp-server"}}}))
    result = run("tool", "list", "--config", str(path))
    assert result.exit_code == 2 and "could not run '/no/such/mcp-server'" in " ".join(result.output.split())


def test_tool_list_shows_long_mcp_names_whole_at_80_columns(tmp_path):
    """Regression (issue 19): names to type were cut at 80 columns (`time.convert…`)."""
    path = tmp_path / "flow.yaml"
    server = fastmcp_config(include=["add", "echo"]).model_dump()
    path.write_text(yaml.safe_dump({"tools": {"python": {}}, "mcp_servers": {"calculator_of_sums": server}}))
    result = CliRunner().invoke(app, ["tool", "list", "--config", str(path)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "calculator_of_sums.echo" in result.output and "calculator_of_sums.add" in result.output
    assert "…" not in result.output and max(map(len, result.output.splitlines())) <= 80

"""Flow tools made from what MCP servers advertise: one `McpTool` per server tool, named SERVER.TOOL."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from mcp import types

from agentflow.errors import ConfigError, UnknownToolError
from agentflow.tools.base import Tool, ToolContext, ToolResult
from agentflow.tools.mcp.config import McpServerConfig
from agentflow.tools.mcp.result import convert_result
from agentflow.tools.mcp.schema import InputSchema, InvalidSchemaError
from agentflow.tools.mcp.server import McpServer, start_servers, stop_servers

log = logging.getLogger(__name__)


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _output_description(spec: types.Tool, server: str) -> str:
    schema = spec.outputSchema
    if not schema:
        return f"What the MCP server {server!r} returns: text; images and other content are noted by type and size."
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    fields = ", ".join(f"{name} ({(value or {}).get('type', 'any')})" for name, value in props.items())
    return f"Text, and a JSON object with {fields or 'the fields of its output schema'}."


def _limitations(spec: types.Tool, schema: InputSchema) -> str:
    notes = []
    hints = spec.annotations
    if hints is not None:
        if hints.destructiveHint or hints.readOnlyHint is False:
            notes.append("May change data on the server.")
        if hints.openWorldHint:
            notes.append("Reaches systems outside the server.")
    if schema.constrained_note:
        notes.append(f"Constrained decoding holds the executor to a JSON object only ({schema.constrained_note}); "
                     "its reply is still validated against the full schema.")
    return " ".join(notes)


class McpTool(Tool):
    """One tool of an MCP server. Its card is what the server advertises; calls go to the shared server."""

    def __init__(self, server: McpServer, spec: types.Tool, schema: InputSchema) -> None:
        super().__init__()
        self.server = server
        self.spec = spec
        self.schema = schema
        self.name = f"{server.name}.{spec.name}"  # type: ignore[misc]  # per instance, a class attribute elsewhere
        self.description = _one_line(spec.description) or _one_line(spec.title) or f"MCP tool {spec.name}"  # type: ignore[misc]
        self.output_description = _output_description(spec, server.name)  # type: ignore[misc]
        self.limitations = _limitations(spec, schema)  # type: ignore[misc]

    def input_schema(self) -> dict[str, Any]:
        return self.schema.schema

    def card(self) -> dict[str, Any]:
        return {**super().card(), "server": self.server.name, "transport": self.server.config.transport,
                "mcp_name": self.spec.name,
                "annotations": self.spec.annotations.model_dump(exclude_none=True) if self.spec.annotations else {}}

    def executor_schema(self) -> dict[str, Any]:
        return self.schema.executor_schema

    def parse_input(self, arguments: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        self.schema.validate(arguments, tool=self.name)
        return dict(arguments)

    async def check(self) -> None:
        await self.server.astart()

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        result = await self.server.call_tool(self.spec.name, args, ctx.timeout_s)
        return convert_result(result, server=self.server.name, tool=self.spec.name,
                              max_chars=self.server.config.max_output_chars)

    async def aclose(self) -> None:
        await self.server.aclose()


def _selected(server: McpServer, listing: list[types.Tool]) -> list[types.Tool]:
    config = server.config
    offered = [spec.name for spec in listing]
    if config.include is not None:
        unknown = sorted(set(config.include) - set(offered))
        if unknown:
            raise ConfigError(f"MCP server {server.name!r}: include names tools it does not offer: "
                              f"{', '.join(unknown)}; it offers: {', '.join(offered) or 'none'}")
    unknown_excluded = sorted(set(config.exclude) - set(offered))
    if unknown_excluded:
        log.warning("MCP server %r: exclude names tools it does not offer: %s", server.name,
                    ", ".join(unknown_excluded))
    return [spec for spec in listing
            if (config.include is None or spec.name in config.include) and spec.name not in config.exclude]


def tools_of(server: McpServer, listing: list[types.Tool]) -> dict[str, McpTool]:
    """The flow tools of one started server; ConfigError for a selected tool whose input schema is unusable."""
    tools: dict[str, McpTool] = {}
    for spec in _selected(server, listing):
        try:
            schema = InputSchema.check(spec.inputSchema)
        except InvalidSchemaError as err:
            raise ConfigError(f"MCP server {server.name!r} advertises an invalid input schema for tool "
                              f"{spec.name!r}: {err}. Leave the tool out with `exclude: [{spec.name}]`.") from None
        tool = McpTool(server, spec, schema)
        tools[tool.name] = tool
    if not tools:
        log.warning("MCP server %r: no tools selected (it offers %d)", server.name, len(listing))
    return tools


def mcp_tools(servers: Mapping[str, McpServerConfig], *, given: Mapping[str, Tool] | None = None) -> dict[str, McpTool]:
    """Start the configured servers (in parallel) and make their tools.

    Servers already behind a tool in `given` (tools shared from another flow) are not started again.
    Raises ConfigError, after stopping the servers it started, when a server cannot start or is misconfigured.
    """
    reused = {tool.server.name for tool in (given or {}).values() if isinstance(tool, McpTool)}
    started = {name: McpServer(name, config) for name, config in servers.items() if name not in reused}
    listings = start_servers(list(started.values()))
    try:
        failures = [str(result) for result in listings.values() if isinstance(result, BaseException)]
        if failures:
            raise ConfigError("; ".join(failures))
        tools: dict[str, McpTool] = {}
        for name, server in started.items():
            listing = listings[name]
            assert not isinstance(listing, BaseException)
            tools.update(tools_of(server, listing))
        return tools
    except ConfigError:
        stop_servers(list(started.values()))
        raise


def _servers_of(tools: Mapping[str, McpTool]) -> list[McpServer]:
    return list({id(tool.server): tool.server for tool in tools.values()}.values())


def mcp_cards(servers: Mapping[str, McpServerConfig]) -> list[dict[str, Any]]:
    """The cards of every configured server's tools (the servers are started, listed and stopped)."""
    tools = mcp_tools(servers)
    try:
        return [tool.card() for tool in tools.values()]
    finally:
        stop_servers(_servers_of(tools))


def mcp_tool_named(servers: Mapping[str, McpServerConfig], name: str) -> McpTool:
    """The tool SERVER.TOOL, its server started (close it with `aclose`); UnknownToolError naming what exists."""
    server_name = name.partition(".")[0]
    if server_name not in servers:
        raise UnknownToolError(f"no MCP server {server_name!r} in the config; configured: "
                               f"{', '.join(servers) or 'none'}")
    tools = mcp_tools({server_name: servers[server_name]})
    if name not in tools:
        stop_servers(_servers_of(tools))
        raise UnknownToolError(f"unknown tool {name!r}; MCP server {server_name!r} offers: {', '.join(tools)}")
    return tools[name]

"""MCP servers as flow tools: every tool a configured Model Context Protocol server offers becomes a flow tool.

`config` holds the settings, `runtime` the event loop the connections live on, `server` one connection with
its lifecycle, `schema` the input-schema checks, `result` the conversion of results, `tool` the flow tools.
This package's own import stays free of the MCP SDK, so tool discovery does not pay for it.
"""

"""MCP servers the tests start: a well-behaved FastMCP server and a hand-written misbehaving one."""

"""The MCP server `mcp_overhead.py` measures: one tool adding two integers (FastMCP; stdio, or HTTP on PORT).

Usage: python benchmarks/mcp_add_server.py [--http PORT]
"""

from __future__ import annotations

import argparse

from mcp.server.fastmcp import FastMCP

server = FastMCP("add", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", type=int, help="Serve streamable HTTP on 127.0.0.1:PORT instead of stdio.")
    args = parser.parse_args()
    if args.http:
        server.settings.port = args.http
        server.run(transport="streamable-http")
    else:
        server.run()

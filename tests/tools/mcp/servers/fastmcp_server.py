"""A well-behaved MCP server built with the SDK's FastMCP, over stdio (default) or streamable HTTP.

    python fastmcp_server.py                 # stdio
    python fastmcp_server.py --http PORT     # http://127.0.0.1:PORT/mcp
"""

from __future__ import annotations

import argparse
import asyncio
import os

from mcp.server.fastmcp import Context, FastMCP, Image
from pydantic import BaseModel, Field

server = FastMCP("agentflow-test", log_level="WARNING")


class Sum(BaseModel):
    total: int = Field(description="a + b")


@server.tool()
def add(a: int, b: int) -> Sum:
    """Add two integers."""
    return Sum(total=a + b)


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return text


@server.tool()
def pid() -> str:
    """The server's process id (tells a restarted server apart)."""
    return str(os.getpid())


@server.tool(structured_output=False)
def picture() -> list[object]:
    """A caption and a small PNG image."""
    return ["a red dot", Image(data=b"\x89PNG\r\n\x1a\n" + bytes(92), format="png")]


@server.tool()
def fail(message: str) -> str:
    """Always fails with the message."""
    raise ValueError(message)


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then say so."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}s"


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The value of an HTTP request header ('' over stdio)."""
    request = ctx.request_context.request
    return request.headers.get(name, "") if request is not None else ""


@server.tool()
def die() -> str:
    """Exit the server process at once, mid-call."""
    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, help="Serve streamable HTTP on 127.0.0.1:PORT instead of stdio.")
    args = parser.parse_args()
    if args.http:
        server.settings.port = args.http
        server.run(transport="streamable-http")
    else:
        server.run()


if __name__ == "__main__":
    main()

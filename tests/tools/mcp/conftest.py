"""Helpers of the MCP tests: configs for the test servers, a streamable-HTTP server, servers closed after use."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentflow.tools.mcp.config import McpHttpServerConfig, McpStdioServerConfig
from agentflow.tools.mcp.server import McpServer, stop_servers
from tests.servers import closed_port

SERVERS = Path(__file__).parent / "servers"


def fastmcp_config(**settings: Any) -> McpStdioServerConfig:
    """The well-behaved FastMCP test server over stdio."""
    return McpStdioServerConfig(command=sys.executable, args=[str(SERVERS / "fastmcp_server.py")], **settings)


def raw_config(mode: str, **settings: Any) -> McpStdioServerConfig:
    """The misbehaving hand-written server in one of its modes (see raw_server.py)."""
    return McpStdioServerConfig(command=sys.executable, args=[str(SERVERS / "raw_server.py"), mode], **settings)


@pytest.fixture
def make_server() -> Iterator[Callable[..., McpServer]]:
    """McpServer objects that are stopped after the test, whatever it did."""
    made: list[McpServer] = []

    def make(name: str, config: Any) -> McpServer:
        made.append(McpServer(name, config))
        return made[-1]

    yield make
    stop_servers(made)


class HttpServerProcess:
    """The FastMCP test server on 127.0.0.1 over streamable HTTP, in a subprocess that can be killed and restarted."""

    def __init__(self) -> None:
        self.port = closed_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        self.process = subprocess.Popen([sys.executable, str(SERVERS / "fastmcp_server.py"), "--http",
                                         str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the HTTP MCP server exited with code {self.process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the HTTP MCP server did not listen within {timeout_s}s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def config(self, **settings: Any) -> McpHttpServerConfig:
        return McpHttpServerConfig(url=self.url, **settings)


@pytest.fixture
def http_mcp_server() -> Iterator[HttpServerProcess]:
    server = HttpServerProcess()
    server.start()
    try:
        yield server
    finally:
        server.kill()

"""What an MCP tool costs next to a built-in one: the same trivial work (adding two integers) as a built-in
tool and as an MCP tool (a FastMCP server over stdio and over streamable HTTP), and the start-up time of MCP
servers (this script's own, and the reference servers `mcp-server-time` and `mcp-server-sqlite`).

Each call goes through what the flow does: `parse_input` (validation), then `run`. Prints a JSON summary.
The MCP server is `benchmarks/mcp_add_server.py`.
Usage: python benchmarks/mcp_overhead.py [--calls 300] [--concurrency 8] [--starts 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agentflow.tools.base import Tool, ToolContext, ToolResult
from agentflow.tools.mcp.config import McpHttpServerConfig, McpServerConfig, McpStdioServerConfig
from agentflow.tools.mcp.runtime import get_runtime
from agentflow.tools.mcp.server import stop_servers
from agentflow.tools.mcp.tool import McpTool, mcp_tools

CTX = ToolContext(timeout_s=30)


class AddInput(BaseModel):
    a: int
    b: int


class AddTool(Tool):
    name = "add"
    description = "Adds two integers."
    input_model = AddInput
    output_description = "The sum."

    async def run(self, args: AddInput, ctx: ToolContext) -> ToolResult:
        return ToolResult(output=str(args.a + args.b), data={"total": args.a + args.b})


async def per_call_ms(tool: Tool, calls: int, concurrency: int) -> dict[str, float]:
    async def call(i: int) -> None:
        await tool.run(tool.parse_input({"a": i, "b": 1}), CTX)

    for i in range(10):  # warm-up
        await call(i)
    latencies = []
    for i in range(calls):
        start = time.perf_counter()
        await call(i)
        latencies.append(1000 * (time.perf_counter() - start))
    semaphore = asyncio.Semaphore(concurrency)

    async def limited(i: int) -> None:
        async with semaphore:
            await call(i)

    start = time.perf_counter()
    await asyncio.gather(*(limited(i) for i in range(calls)))
    throughput = calls / (time.perf_counter() - start)
    return {"median_ms": round(statistics.median(latencies), 3),
            "p90_ms": round(statistics.quantiles(latencies, n=10)[-1], 3),
            f"calls_per_s_at_{concurrency}": round(throughput, 1)}


async def bridge_ms(calls: int) -> float:
    """Median cost of reaching the MCP loop and back (what agentflow adds to the SDK's own call)."""

    async def nothing() -> None:
        return None

    runtime = get_runtime()
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        await runtime.call(nothing())
        latencies.append(1000 * (time.perf_counter() - start))
    return round(statistics.median(latencies), 3)


def start_seconds(name: str, config: McpServerConfig, starts: int) -> float:
    """Median seconds from nothing to a listed server: spawn or connect, MCP handshake, tools/list."""
    times = []
    for _ in range(starts):
        start = time.perf_counter()
        tools = mcp_tools({name: config})
        times.append(time.perf_counter() - start)
        stop_servers(list({id(t.server): t.server for t in tools.values()}.values()))
    return round(statistics.median(times), 3)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the HTTP server did not listen on port {port}")


async def main(calls: int, concurrency: int, starts: int) -> dict[str, Any]:
    add_server = str(Path(__file__).resolve().parent / "mcp_add_server.py")
    stdio = McpStdioServerConfig(command=sys.executable, args=[add_server], max_concurrency=concurrency)
    port = free_port()
    http_process = subprocess.Popen([sys.executable, add_server, "--http", str(port)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        http = McpHttpServerConfig(url=f"http://127.0.0.1:{port}/mcp", max_concurrency=concurrency)
        tools = await asyncio.to_thread(mcp_tools, {"stdio": stdio, "http": http})
        mcp_stdio: McpTool = tools["stdio.add"]
        mcp_http: McpTool = tools["http.add"]
        report: dict[str, Any] = {"calls": calls, "concurrency": concurrency, "load_average": os.getloadavg()[0],
                                   "cpus": os.cpu_count()}
        report["built_in"] = await per_call_ms(AddTool(), calls, concurrency)
        report["mcp_stdio"] = await per_call_ms(mcp_stdio, calls, concurrency)
        report["mcp_http"] = await per_call_ms(mcp_http, calls, concurrency)
        for tool in (mcp_stdio, mcp_http):
            await tool.aclose()
        report["bridge_to_mcp_loop_ms"] = await bridge_ms(calls)
        report["overhead_ms_per_call"] = {
            kind: round(report[kind]["median_ms"] - report["built_in"]["median_ms"], 3)
            for kind in ("mcp_stdio", "mcp_http")}
        bin_dir = Path(sys.executable).parent
        with tempfile.TemporaryDirectory() as tmp:
            report["startup_s"] = {
                "fastmcp_add_stdio": start_seconds("stdio", stdio, starts),
                "fastmcp_add_http_connect": start_seconds("http", http, starts),
                "mcp-server-time": start_seconds("time", McpStdioServerConfig(
                    command=str(bin_dir / "mcp-server-time")), starts),
                "mcp-server-sqlite": start_seconds("db", McpStdioServerConfig(
                    command=str(bin_dir / "mcp-server-sqlite"), args=["--db-path", f"{tmp}/b.db"]), starts),
            }
        return report
    finally:
        http_process.kill()
        http_process.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--starts", type=int, default=3, help="Start-ups timed per server (median reported).")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.calls, args.concurrency, args.starts)), indent=1))

"""One MCP server: started once, shared by concurrent calls, restarted when it dies, closed with its flow.

Each connection has an owner task on the MCP loop (`runtime.py`) that enters the SDK's transport and session
and later leaves them, as anyio requires. A pump between the transport and the session sees the connection
end (the process exited, the HTTP stream failed) and the malformed lines a server writes, so a call in flight
ends with a clear error at once instead of waiting out its timeout. The next call starts a new connection.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

import anyio
import httpx
from mcp import ClientSession, McpError, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from agentflow.errors import ConfigError, ToolError, ToolTimeoutError
from agentflow.tools.mcp.config import McpHttpServerConfig, McpServerConfig, McpStdioServerConfig
from agentflow.tools.mcp.connection import (
    Connection,
    describe_error,
    leaf_error,
    stderr_file,
    validation_summary,
)
from agentflow.tools.mcp.runtime import McpRuntime, get_runtime

log = logging.getLogger(__name__)

CLIENT_INFO = types.Implementation(name="agentflow", version="0.1.0")
CLOSE_TIMEOUT_S = 10.0
"""Bound on closing one connection (stdio: 2 s for the server to exit after stdin closes, then a kill)."""
SDK_TIMEOUT_MARGIN_S = 1.0
MAX_TOOL_PAGES = 100
"""tools/list pages read at most: a server whose cursor never ends cannot hang the start."""
_LOST_CODES = {types.CONNECTION_CLOSED, 32600}  # 32600: the SDK's "Session terminated" (HTTP 404 on a session)


class McpServerError(ToolError):
    """The server failed, not the call's arguments: it died, hung at start, or sent messages we cannot read."""

    kind = "mcp_server"


class McpServer:
    """A configured server. Its methods may be awaited from any event loop; the work runs on the MCP loop."""

    def __init__(self, name: str, config: McpServerConfig) -> None:
        self.name = name
        self.config = config
        self.starts = 0
        self.startup_seconds: float | None = None
        self._conn: Connection | None = None
        self._owners: set[asyncio.Task[None]] = set()  # strong references, old connections' still closing
        self._runtime: McpRuntime | None = None
        self._start_lock: asyncio.Lock | None = None
        self._slots: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"McpServer({self.name!r}, {self.where})"

    @property
    def where(self) -> str:
        config = self.config
        if isinstance(config, McpHttpServerConfig):
            return config.url
        return " ".join([config.command, *config.args])

    # -- public: any loop or thread ------------------------------------------------------------

    async def astart(self) -> list[types.Tool]:
        """Start the server if it is not running; the tools it offers. Raises ConfigError when it cannot."""
        return await get_runtime().call(self._start_for_config())

    async def call_tool(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> types.CallToolResult:
        """One tools/call, within `timeout_s` (waiting for a free slot included). Raises ToolError subclasses."""
        return await get_runtime().call(self._call_tool(tool, arguments, timeout_s))

    async def aclose(self) -> None:
        """Stop the server (idempotent). A later call starts it again."""
        if self._runtime is None or self._runtime is not get_runtime():
            return
        await self._runtime.call(self._close())

    # -- on the MCP loop -----------------------------------------------------------------------

    def _bind(self) -> None:
        """Loop-bound state, made anew in a forked child (whose connections belong to the parent)."""
        runtime = get_runtime()
        if self._runtime is not runtime:
            self._runtime = runtime
            self._conn, self._owners = None, set()
            self._start_lock = asyncio.Lock()
            self._slots = asyncio.Semaphore(self.config.max_concurrency)

    async def _start_for_config(self) -> list[types.Tool]:
        try:
            return (await self._connection()).tools
        except McpServerError as err:
            raise ConfigError(str(err)) from None

    async def _connection(self) -> Connection:
        """The running connection, started (again) if there is none. A caller that gives up while it starts
        (its timeout) leaves the start going for the next caller."""
        self._bind()
        assert self._start_lock is not None and self._runtime is not None
        async with self._start_lock:
            conn = self._conn
            if conn is None or conn.ended.is_set():
                if conn is not None:
                    log.warning("MCP server %r: restarting (%s)", self.name, conn.end_reason)
                conn = self._conn = Connection(runtime=self._runtime, ready=asyncio.get_running_loop().create_future())
                conn.ready.add_done_callback(_retrieve)
                conn.owner = asyncio.create_task(self._own(conn), name=f"mcp-{self.name}")
                self._owners.add(conn.owner)
                conn.owner.add_done_callback(self._owners.discard)
        await asyncio.shield(conn.ready)
        return conn

    def _started(self, conn: Connection, seconds: float) -> None:
        assert self._runtime is not None
        self._runtime.register_closer(id(self), self._close)
        self.starts += 1
        self.startup_seconds = seconds
        log.info("MCP server %r started in %.2fs (protocol %s, %d tools)", self.name, seconds,
                 conn.protocol_version, len(conn.tools))

    async def _own(self, conn: Connection) -> None:
        """Owner task: enter the transport and session, serve until the connection ends, leave them."""
        start = time.perf_counter()
        try:
            async with AsyncExitStack() as stack:
                read, write = await self._enter_transport(stack, conn)
                to_session, session_read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
                tasks = await stack.enter_async_context(anyio.create_task_group())
                tasks.start_soon(self._pump, read, to_session, conn)
                session = await stack.enter_async_context(
                    ClientSession(session_read, write, client_info=CLIENT_INFO, logging_callback=self._server_log))
                with anyio.fail_after(self.config.startup_timeout_s):
                    init = await session.initialize()
                    conn.tools = await self._list_tools(session)
                conn.session, conn.protocol_version = session, str(init.protocolVersion)
                self._started(conn, time.perf_counter() - start)
                conn.ready.set_result(None)
                await conn.ended.wait()
                tasks.cancel_scope.cancel()
        except BaseException as err:  # an owner ends quietly: its error goes to the starter or the calls
            if isinstance(err, asyncio.CancelledError) and not conn.ended.is_set():
                conn.end("the MCP client was cancelled")
            if not conn.ready.done():
                conn.ready.set_exception(McpServerError(self._start_failure(err, conn)))
            else:
                conn.end(f"the connection failed ({describe_error(err)})")
        finally:
            conn.end("the connection closed")
            conn.close_stderr()

    async def _enter_transport(self, stack: AsyncExitStack, conn: Connection) -> tuple[Any, Any]:
        config = self.config
        if isinstance(config, McpStdioServerConfig):
            conn.stderr = stderr_file(self.name)
            params = StdioServerParameters(command=config.command, args=config.args, env=config.resolved_env(),
                                           cwd=config.cwd)
            read, write = await stack.enter_async_context(stdio_client(params, errlog=conn.stderr))  # type: ignore[arg-type]
            return read, write
        client = await stack.enter_async_context(httpx.AsyncClient(
            headers=config.resolved_headers(), follow_redirects=True,
            timeout=httpx.Timeout(config.startup_timeout_s, read=None)))
        read, write, _ = await stack.enter_async_context(streamable_http_client(config.url, http_client=client))
        return read, write

    async def _pump(self, read: Any, to_session: Any, conn: Connection) -> None:
        """Forward the server's messages to the session, counting malformed ones; note the end of the stream."""
        async with to_session:
            try:
                async for item in read:
                    if isinstance(item, Exception):
                        conn.malformed += 1
                        conn.last_malformed = describe_error(item)[:300]
                        log.warning("MCP server %r sent a malformed message: %s", self.name, conn.last_malformed)
                        continue
                    await to_session.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                pass
        conn.end("the server closed the connection (it exited or the stream broke)")

    async def _list_tools(self, session: ClientSession) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_TOOL_PAGES):
            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools += page.tools
            cursor = page.nextCursor
            if not cursor:
                return tools
        raise McpServerError(f"MCP server {self.name!r} listed more than {MAX_TOOL_PAGES} pages of tools")

    async def _server_log(self, params: types.LoggingMessageNotificationParams) -> None:
        log.debug("MCP server %r [%s] %s", self.name, params.level, params.data)

    def _start_failure(self, err: BaseException, conn: Connection) -> str:
        leaf = leaf_error(err)
        if isinstance(leaf, McpServerError):
            return str(leaf)
        if isinstance(leaf, FileNotFoundError | PermissionError) and isinstance(self.config, McpStdioServerConfig):
            what = f"could not run {self.config.command!r} ({type(leaf).__name__}: {leaf.strerror})"
        elif isinstance(leaf, TimeoutError):
            what = f"did not finish the MCP handshake and tool listing within {self.config.startup_timeout_s:.0f}s"
        elif isinstance(leaf, McpError) and leaf.error.code in _LOST_CODES:
            what = "exited (or closed the connection) during start-up"
        elif isinstance(leaf, ValidationError):
            what = f"answered the start-up requests with malformed results ({validation_summary(leaf)})"
        else:
            what = f"failed to start: {describe_error(leaf)}"
        diagnosis = conn.diagnosis()
        return f"MCP server {self.name!r} ({self.where}) {what}" + (f"; {diagnosis}" if diagnosis else "")

    async def _call_tool(self, tool: str, arguments: dict[str, Any], timeout_s: float) -> types.CallToolResult:
        self._bind()
        start = time.monotonic()

        async def call() -> types.CallToolResult:
            assert self._slots is not None
            async with self._slots:
                conn = await self._connection()
                return await self._call_on(conn, tool, arguments, max(timeout_s - (time.monotonic() - start), 0.001))

        try:
            return await asyncio.wait_for(call(), timeout_s)
        except asyncio.TimeoutError:
            raise ToolTimeoutError(self._timeout_message(tool, timeout_s)) from None

    async def _call_on(self, conn: Connection, tool: str, arguments: dict[str, Any],
                       timeout_s: float) -> types.CallToolResult:
        assert conn.session is not None
        # the caller's own time limit governs; the SDK's read timeout, a little later, is only a safety net
        call = asyncio.ensure_future(conn.session.call_tool(
            tool, arguments, read_timeout_seconds=timedelta(seconds=timeout_s + SDK_TIMEOUT_MARGIN_S)))
        ended = asyncio.ensure_future(conn.ended.wait())
        for task in (call, ended):
            task.add_done_callback(_retrieve)
        try:
            await asyncio.wait({call, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (call, ended):
                task.cancel()
            conn.trim_stderr()
        if call.done() and not call.cancelled() and call.exception() is None:
            return call.result()
        if conn.ended.is_set():
            raise self._lost(conn, tool)
        raise self._call_error(conn, tool, call.exception(), timeout_s)

    def _lost(self, conn: Connection, tool: str) -> McpServerError:
        diagnosis = conn.diagnosis()
        return McpServerError(f"MCP server {self.name!r}: {conn.end_reason} during the call to {tool!r}; it will be "
                              f"restarted on the next call" + (f"; {diagnosis}" if diagnosis else ""))

    def _call_error(self, conn: Connection, tool: str, err: BaseException | None, timeout_s: float) -> ToolError:
        """The error a failed call raises (the call's own exception, classified)."""
        if isinstance(err, McpError):
            if err.error.code == 408:  # the SDK's own read timeout
                return ToolTimeoutError(self._timeout_message(tool, timeout_s, conn))
            if err.error.code in _LOST_CODES:
                conn.end(f"the connection was lost ({err.error.message})")
                return self._lost(conn, tool)
            return ToolError(f"MCP server {self.name!r} refused the call to {tool!r}: {err.error.message} "
                             f"(code {err.error.code})")
        if isinstance(err, anyio.ClosedResourceError | anyio.BrokenResourceError):
            conn.end("the connection was closed")
            return self._lost(conn, tool)
        if isinstance(err, ValidationError):
            return McpServerError(f"MCP server {self.name!r} answered the call to {tool!r} with a malformed "
                                  f"result: {validation_summary(err)}")
        return McpServerError(f"MCP server {self.name!r}: the call to {tool!r} failed: "
                              f"{describe_error(err or Exception())}")

    def _timeout_message(self, tool: str, timeout_s: float, conn: Connection | None = None) -> str:
        conn = conn or self._conn
        diagnosis = conn.diagnosis() if conn is not None else ""
        return (f"MCP server {self.name!r}: no answer to the call to {tool!r} within {timeout_s:.1f}s"
                + (f"; {diagnosis}" if diagnosis else ""))

    async def _close(self) -> None:
        self._bind()
        assert self._runtime is not None
        self._runtime.unregister_closer(id(self))
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.end("the flow closed the server")
            if not conn.ready.done() and conn.owner is not None:  # still starting: a cancelled start kills it
                conn.owner.cancel()
        owners = set(self._owners)
        if not owners:
            return
        _, pending = await asyncio.wait(owners, timeout=CLOSE_TIMEOUT_S)
        if pending:
            log.warning("MCP server %r did not close within %.0fs; cancelling its client", self.name,
                        CLOSE_TIMEOUT_S)
            for owner in pending:
                owner.cancel()
            await asyncio.wait(pending, timeout=CLOSE_TIMEOUT_S)


def start_servers(servers: list[McpServer]) -> dict[str, list[types.Tool] | BaseException]:
    """Start several servers at once, from sync code: name -> the tools it offers, or the error it failed with."""
    if not servers:
        return {}

    async def start_all() -> list[list[types.Tool] | BaseException]:
        return await asyncio.gather(*(server._start_for_config() for server in servers), return_exceptions=True)

    timeout = max(server.config.startup_timeout_s for server in servers) + CLOSE_TIMEOUT_S
    try:
        results = get_runtime().run(start_all(), timeout=timeout)
    except concurrent.futures.TimeoutError:  # a safety net: each start has its own, shorter, time limit
        results = [ConfigError(f"MCP server {server.name!r} did not start within {timeout:.0f}s") for server in servers]
    return {server.name: result for server, result in zip(servers, results, strict=True)}


def stop_servers(servers: list[McpServer]) -> None:
    """Close several servers at once, from sync code."""
    if not servers:
        return

    async def stop_all() -> None:
        await asyncio.gather(*(server._close() for server in servers), return_exceptions=True)

    get_runtime().run(stop_all(), timeout=2 * CLOSE_TIMEOUT_S)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a helper task's exception as seen, whether or not the call got to read it (no asyncio warning)."""
    if not task.cancelled():
        task.exception()

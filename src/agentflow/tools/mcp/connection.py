"""One connection to an MCP server: its state, and what it tells about a failure (its stderr, the malformed
messages it sent), in words for the error messages the flow records."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import IO

import httpx
from mcp import ClientSession, McpError, types
from pydantic import ValidationError

from agentflow.tools.mcp.runtime import McpRuntime

STDERR_TAIL_CHARS = 1500
STDERR_MAX_BYTES = 1 << 20
"""A stdio server's stderr is kept in a temporary file for error messages; past this size only its tail stays."""


@dataclass
class Connection:
    """One connection's state, owned by its task on the MCP loop (`McpServer._own`)."""

    runtime: McpRuntime
    ready: asyncio.Future[None]
    """Done once the server has answered the handshake and listed its tools; holds the start's error if not."""
    owner: asyncio.Task[None] | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    end_reason: str = ""
    session: ClientSession | None = None
    tools: list[types.Tool] = field(default_factory=list)
    protocol_version: str = ""
    malformed: int = 0
    last_malformed: str = ""
    stderr: IO[bytes] | None = None
    final_stderr: str = ""
    """The stderr tail read when the file was closed: a call failing after its server exited still shows it."""

    def end(self, reason: str) -> None:
        if not self.ended.is_set():
            self.end_reason = reason
            self.ended.set()

    def stderr_tail(self) -> str:
        if self.stderr is None or self.stderr.closed:
            return self.final_stderr
        fd = self.stderr.fileno()
        size = os.fstat(fd).st_size
        text = os.pread(fd, STDERR_TAIL_CHARS, max(size - STDERR_TAIL_CHARS, 0)).decode("utf-8", "replace")
        return text.strip()

    def trim_stderr(self) -> None:
        """Keep a chatty server's stderr file small (it is open in append mode, so the server writes at its end)."""
        if self.stderr is None or self.stderr.closed:
            return
        fd = self.stderr.fileno()
        size = os.fstat(fd).st_size
        if size > STDERR_MAX_BYTES:
            tail = os.pread(fd, STDERR_TAIL_CHARS, size - STDERR_TAIL_CHARS)
            os.ftruncate(fd, 0)
            os.write(fd, tail)

    def close_stderr(self) -> None:
        if self.stderr is not None and not self.stderr.closed:
            self.final_stderr = self.stderr_tail()
            self.stderr.close()

    def diagnosis(self) -> str:
        """What the server showed besides its answers: malformed lines, its stderr."""
        parts = []
        if self.malformed:
            parts.append(f"it sent {self.malformed} malformed message(s), the last: {self.last_malformed}")
        tail = self.stderr_tail()
        if tail:
            parts.append(f"its stderr ends with: {tail}")
        return "; ".join(parts)


if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup


def leaf_error(err: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def describe_error(err: BaseException) -> str:
    err = leaf_error(err)
    if isinstance(err, McpError):
        return f"MCP error {err.error.code}: {err.error.message}"
    if isinstance(err, TimeoutError):
        return "timed out"
    if isinstance(err, httpx.HTTPStatusError):
        return f"HTTP {err.response.status_code} from {err.request.url}"
    if isinstance(err, httpx.HTTPError):
        return f"{type(err).__name__}: {err or 'no detail'}"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else 'no detail'}"


def stderr_file(server: str) -> IO[bytes]:
    """A temporary file for a stdio server's stderr, in append mode (so `trim_stderr` can cut it under the
    server's feet); closed by the connection's owner."""
    file = tempfile.TemporaryFile(prefix=f"mcp-{server}-")  # noqa: SIM115
    if sys.platform != "win32":
        import fcntl

        flags = fcntl.fcntl(file.fileno(), fcntl.F_GETFL)
        fcntl.fcntl(file.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)
    return file


def validation_summary(err: ValidationError) -> str:
    first = err.errors()[0]
    return f"{err.error_count()} error(s), first: {first['msg']} at {'.'.join(map(str, first['loc'])) or 'top level'}"

"""The event loop MCP connections live on: one daemon thread per process.

The SDK's transports are anyio task groups that must be entered and left by one task, and a flow is used from
many event loops over its life (`Flow.solve` runs one per question, evaluation and training their own). Each
connection's owner task therefore runs here, and callers on any loop or thread reach it through `call` (from
async code) or `run` (from sync code, e.g. `Flow.from_config`). Cancelling the caller cancels the work here.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

CLOSE_AT_EXIT_S = 10.0
"""How long the interpreter waits at exit for servers still open to shut down (stdio: close stdin, then kill)."""


class McpRuntime:
    """A private asyncio loop in a daemon thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="agentflow-mcp", daemon=True)
        self._thread.start()
        self._closers: dict[int, Callable[[], Awaitable[None]]] = {}

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` on the MCP loop from another loop; cancelling this call cancels it there."""
        if threading.current_thread() is self._thread:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the MCP loop and block until it ends (from sync code only)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("McpRuntime.run used from the MCP loop itself")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def register_closer(self, key: int, closer: Callable[[], Awaitable[None]]) -> None:
        """`closer` runs at interpreter exit unless unregistered first (a server closed by its flow)."""
        self._closers[key] = closer

    def unregister_closer(self, key: int) -> None:
        self._closers.pop(key, None)

    def close_all(self) -> None:
        closers = list(self._closers.values())
        self._closers.clear()
        if not closers or not self._thread.is_alive():
            return

        async def close() -> None:
            await asyncio.gather(*(closer() for closer in closers), return_exceptions=True)

        try:
            self.run(close(), timeout=CLOSE_AT_EXIT_S)
        except Exception as err:  # at exit: never block the interpreter on a server that will not stop
            log.warning("MCP servers not closed cleanly at exit: %s", err)


_runtime: McpRuntime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> McpRuntime:
    """The process's MCP loop, started on first use (and again in a forked child, which has no such thread)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = McpRuntime()
        return _runtime


@atexit.register
def _close_at_exit() -> None:
    if _runtime is not None and _runtime.pid == os.getpid():
        _runtime.close_all()

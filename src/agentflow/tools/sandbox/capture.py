"""Reading a child's output within a byte budget: the head and the tail are kept, the middle is counted."""

from __future__ import annotations

import asyncio

_READ_CHUNK = 64 * 1024


class Capture:
    """Keeps the head and the tail of a stream within a byte budget; counts what it drops in between."""

    def __init__(self, limit_bytes: int) -> None:
        self.head_cap = max(0, limit_bytes // 2)
        self.tail_cap = max(0, limit_bytes - self.head_cap)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_cap:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_cap:  # trim rarely, so feeding stays linear
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - min(len(self.tail), self.tail_cap)

    def text(self) -> str:
        tail = bytes(self.tail[-self.tail_cap:]) if self.tail_cap else b""
        head = self.head.decode("utf-8", "replace")
        if not self.dropped:
            return head + tail.decode("utf-8", "replace")
        return (f"{head}\n... [truncated {self.dropped} bytes] ...\n"
                f"{tail.decode('utf-8', 'replace')}")


async def drain(stream: asyncio.StreamReader | None, capture: Capture) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_READ_CHUNK):
        capture.feed(chunk)

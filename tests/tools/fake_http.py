"""A real HTTP server on 127.0.0.1 whose answers each test scripts, for the HTTP-backed tools.

The `http_server` fixture is exported to the tests through `conftest.py`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class Reply:
    status: int = 200
    body: Any = field(default_factory=dict)
    raw: bytes | None = None
    delay_s: float = 0.0


@dataclass
class FakeServer:
    url: str
    requests: list[Request]
    reply: Callable[[Request], Reply]


@pytest.fixture
def http_server() -> Iterator[FakeServer]:
    """Serve `server.reply(request)` for every request; record the requests in `server.requests`."""
    holder: dict[str, FakeServer] = {}

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            request = Request(self.command, parts.path, parse_qs(parts.query), dict(self.headers.items()), body)
            server = holder["server"]
            server.requests.append(request)
            reply = server.reply(request)
            if reply.delay_s:
                time.sleep(reply.delay_s)
            payload = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout tests)

        do_GET = do_POST = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    server = FakeServer(f"http://127.0.0.1:{httpd.server_address[1]}", [], lambda r: Reply())
    holder["server"] = server
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()

"""The local server: the page, its static modules, and `/api/...` JSON (stdlib `http.server`, one thread per
request). It serves only the shipped assets and the routes of `api.py`, never a path a request names."""

from __future__ import annotations

import logging
import mimetypes
import socket
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from agentflow.view.api import NotFound, ViewApp, dumps
from agentflow.view.page import render, static_files

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ViewServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, app: ViewApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self.page = render()
        self.assets = static_files()
        self.bind_host = host
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), ViewHandler)

    @property
    def url(self) -> str:
        host = self.bind_host if self.bind_host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.server_address[1]}/"

    def host_allowed(self, header: str | None) -> bool:
        """A page on another site can resolve its own name to 127.0.0.1 (DNS rebinding); accept only our names."""
        if self.bind_host in ("", "0.0.0.0", "::"):
            return True  # the user chose to serve every interface
        if not header:
            return False
        name = header.rsplit(":", 1)[0] if not header.endswith("]") else header
        name = name.strip("[]")
        return name in (*LOOPBACK, self.bind_host)


class ViewHandler(BaseHTTPRequestHandler):
    server: ViewServer
    server_version = "agentflow-view"
    protocol_version = "HTTP/1.1"  # keep-alive: the page's modules come over a few connections, not one each

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str, *, cache: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy", self.server.page.csp)
        self.send_header("Cache-Control", "max-age=60" if cache else "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, dumps(payload).encode(), "application/json; charset=utf-8")

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if not self.server.host_allowed(self.headers.get("Host")):
            self._send(HTTPStatus.FORBIDDEN, b"unexpected Host header", "text/plain; charset=utf-8")
            return
        url = urlsplit(self.path)
        path = url.path
        if path in ("/", "/index.html"):
            self._send(HTTPStatus.OK, self.server.page.html.encode(), "text/html; charset=utf-8")
        elif path.startswith("/static/") and path[len("/static/"):] in self.server.assets:
            file = self.server.assets[path[len("/static/"):]]
            content_type = "text/javascript" if file.suffix == ".js" else mimetypes.guess_type(file.name)[0]
            self._send(HTTPStatus.OK, file.read_bytes(), f"{content_type or 'text/plain'}; charset=utf-8")
        elif path == "/api" or path.startswith("/api/"):
            try:
                payload = self.server.app.get(path[len("/api"):] or "/", dict(parse_qsl(url.query)))
            except NotFound as err:
                self._json(HTTPStatus.NOT_FOUND, {"error": str(err)})
            except Exception as err:  # a broken file must give the page a message, not a dropped connection
                log.exception("view: %s failed", path)
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(err).__name__}: {err}"})
            else:
                self._json(HTTPStatus.OK, payload)
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain; charset=utf-8")

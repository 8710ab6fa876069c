"""The local server over real HTTP: the page and its modules, the JSON twins, and nothing else."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentflow.view.api import ViewApp
from agentflow.view.server import ViewServer
from tests.view.builders import eval_run, right_on_france


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ViewServer]:
    app = ViewApp([eval_run(tmp_path / "run", right_on_france)])
    server = ViewServer(app)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def get(server: ViewServer, path: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    headers = {"Host": host} if host else {}
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, body


def test_listens_on_loopback_on_a_free_port(server: ViewServer) -> None:
    assert server.server_address[0] == "127.0.0.1" and server.server_address[1] > 0
    assert server.url == f"http://127.0.0.1:{server.server_address[1]}/"


def test_page_modules_and_json(server: ViewServer) -> None:
    status, headers, body = get(server, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in headers["content-security-policy"] and headers["x-content-type-options"] == "nosniff"
    assert b'"af/":"/static/js/"' in body
    status, headers, body = get(server, "/static/js/app.js")
    assert status == 200 and headers["content-type"].startswith("text/javascript") and b"ROUTES" in body
    status, headers, body = get(server, "/api/run/0")
    assert status == 200 and headers["cache-control"] == "no-store"
    assert json.loads(body)["benchmarks"][0]["correct"] == 1
    status, _, body = get(server, "/api/run/0/item/nope")
    assert status == 404 and "not found" in json.loads(body)["error"]


@pytest.mark.parametrize("path", ["/static/../api.py", "/static/js/../../server.py", "/static/%2e%2e/api.py",
                                  "/etc/passwd", "/static/", "/api.py"])
def test_serves_no_other_file(server: ViewServer, path: str) -> None:
    assert get(server, path)[0] == 404


def test_refuses_other_host_names(server: ViewServer) -> None:
    port = server.server_address[1]
    assert get(server, "/api/run/0", host=f"localhost:{port}")[0] == 200
    # a page of another site whose name resolves to 127.0.0.1 (DNS rebinding) gets nothing
    assert get(server, "/api/run/0", host=f"attacker.example:{port}")[0] == 403


def test_broken_files_give_a_message_not_a_dropped_connection(server: ViewServer, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "run" / "config.json").write_text("[]")
    (tmp_path / "run" / "results.jsonl").write_bytes(b"\xff\xfe\n")
    status, _, body = get(server, "/api/run/0")
    assert status == 200 and json.loads(body)["config"] == {} and json.loads(body)["rows"] == []

    def crash(route: str, query: object = None) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(server.app, "get", crash)
    status, _, body = get(server, "/api/run/0")
    assert status == 500 and json.loads(body) == {"error": "RuntimeError: disk on fire"}

"""`agentflow view`: the server as a user starts it, the export, and the errors."""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from typer.testing import CliRunner

from agentflow import cli
from agentflow.view.api import ViewApp
from agentflow.view.cli import browser_available
from tests.view.builders import eval_run, right_on_france, right_on_hamlet, train_run

runner = CliRunner()


def _start_view(paths: list[Path], prelude: str = "") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("DISPLAY", None)
    # the server starts as from a terminal: Ctrl-C's SIGINT at its default, whatever this process inherited (a
    # child keeps an ignored SIGINT, and Python then installs no KeyboardInterrupt; in the full suite the test
    # process had it ignored and the server never stopped)
    return subprocess.Popen([sys.executable, "-c", f"{prelude}from agentflow.cli import app; app()", "view",
                             *map(str, paths)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


# generous: a busy machine must not fail these tests (8 s fired on a 2-core machine running two evaluations
# beside the suite); a hung server would wait forever, not 60 s
EXIT_LIMIT_S = 60


def test_serves_on_loopback_prints_the_url_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    run = eval_run(tmp_path / "run", right_on_france)
    process = _start_view([run])
    try:
        url = None
        for _ in range(5):
            line = process.stdout.readline()
            match = re.match(r"(http://127\.0\.0\.1:\d+/)#/run/0$", line.strip())
            if match:
                url = match.group(1)
                break
        assert url, process.stderr.read() if process.poll() is not None else "no URL printed"
        with urllib.request.urlopen(url + "api/") as response:
            assert json.load(response)["home"] == "/run/0"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=EXIT_LIMIT_S) == 0
        assert "stopped" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_ctrl_c_stops_at_once_with_live_connections_and_busy_threads(tmp_path: Path) -> None:
    """Regression (issue 19): after a browser had the page open, Ctrl-C left the server running until SIGTERM.
    Here a keep-alive connection, a half-sent request and a thread that never ends are all alive: a normal
    interpreter exit would wait on that thread for ever."""
    import http.client
    import socket
    import time

    run = train_run(tmp_path / "train", new_format=True)
    process = _start_view([run], prelude="import threading, time; "
                          "threading.Thread(target=time.sleep, args=(3600,)).start(); ")
    connections = []
    try:
        line = process.stdout.readline() + process.stdout.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", line).group(1))
        keep_alive = http.client.HTTPConnection("127.0.0.1", port)
        keep_alive.request("GET", "/api/train/0")
        assert keep_alive.getresponse().read()                    # the connection stays open
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"GET /api/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # a request still arriving
        connections += [keep_alive, half]
        start = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=EXIT_LIMIT_S) == 0
        assert time.monotonic() - start < EXIT_LIMIT_S
    finally:
        for connection in connections:
            connection.close()
        if process.poll() is None:
            process.kill()
            process.wait()


def test_export_writes_one_self_contained_file(tmp_path: Path) -> None:
    a, b = eval_run(tmp_path / "a", right_on_france), eval_run(tmp_path / "b", right_on_hamlet)
    trained = train_run(tmp_path / "train", new_format=True)
    out = tmp_path / "share" / "report.html"
    result = runner.invoke(cli.app, ["view", str(a), str(b), str(trained), "--export", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and out.is_file()
    html = out.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:|//|/static)""", html)   # nothing to fetch
    importmap = json.loads(re.search(r'<script type="importmap">(.*?)</script>', html, re.S).group(1))
    assert importmap["imports"] and all(v.startswith("data:text/javascript;base64,")
                                        for v in importmap["imports"].values())
    assert "Content-Security-Policy" in html
    bundle = json.loads(re.search(r'<script type="application/json" id="af-data">(.*?)</script>', html, re.S)
                        .group(1))
    app = ViewApp([a, b, trained])
    assert set(bundle) == set(app.routes())
    answer = json.loads(gzip.decompress(base64.b64decode(bundle["/compare/0/1"])))
    assert answer == json.loads(json.dumps(app.get("/compare/0/1")))


def test_export_escapes_everything_that_could_close_its_script(tmp_path: Path) -> None:
    questions = [{"pid": "</script><script>alert(1)</script>", "question": "</script>?", "answer": "x"}]
    run = eval_run(tmp_path / "run", right_on_france, questions=questions)
    out = tmp_path / "r.html"
    assert runner.invoke(cli.app, ["view", str(run), "--export", str(out)]).exit_code == 0
    html = out.read_text()
    assert html.count("</script>") == html.count("<script")           # only the page's own script elements


def test_errors(tmp_path: Path) -> None:
    result = runner.invoke(cli.app, ["view", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "does not exist" in result.output
    busy = eval_run(tmp_path / "run", right_on_france)
    result = runner.invoke(cli.app, ["view", str(busy), "--host", "256.1.1.1", "--no-open"])
    assert result.exit_code == 2 and "cannot listen" in result.output


def test_no_browser_is_opened_on_a_headless_machine(monkeypatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"):
        monkeypatch.delenv(name, raising=False)
    assert not browser_available()
    monkeypatch.setenv("BROWSER", "firefox")
    assert browser_available()


def test_unreadable_input_is_an_error_in_the_terminal_not_only_on_the_page(tmp_path: Path) -> None:
    """Regression (issue 19): a truncated trajectory, `{"hello": 1}` or an empty file started the server (and
    `--export` wrote a report) with exit 0."""
    good = json.dumps({"question": "q", "answer": "a", "turns": []})
    broken = {"truncated.json": good[:20], "hello.json": '{"hello": 1}', "empty.json": ""}
    for name, text in broken.items():
        path = tmp_path / name
        path.write_text(text)
        out = tmp_path / f"{name}.html"
        for extra in (["--export", str(out)], ["--no-open", "--port", "0"]):
            result = runner.invoke(cli.app, ["view", str(path), *extra])
            assert result.exit_code == 2, (name, extra, result.output)
            assert "nothing readable to view" in result.output and name in result.output
        assert not out.exists()
    assert "not a trajectory" in runner.invoke(cli.app, ["view", str(tmp_path / "hello.json")]).output

    junk_run = tmp_path / "junk_run"
    junk_run.mkdir()
    (junk_run / "results.jsonl").write_text("not json\n")
    result = runner.invoke(cli.app, ["view", str(junk_run), "--export", str(tmp_path / "junk.html")])
    assert result.exit_code == 2 and "results.jsonl has no readable line" in result.output

    run = eval_run(tmp_path / "run", right_on_france)                   # one readable source: a warning
    result = runner.invoke(cli.app, ["view", str(run), str(tmp_path / "hello.json"), "--export",
                                     str(tmp_path / "mixed.html")])
    assert result.exit_code == 0 and "warning" in result.output and "hello.json" in result.output

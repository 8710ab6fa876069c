"""Real HTTP servers on 127.0.0.1 for tests: a scriptable fake OpenAI-compatible server, and llama.cpp's own.

The fake server answers each request with the next step of its script (the last step repeats):

    with fake_openai_server(status(429), reply("hello")) as server:
        engine = OpenAIEngine(OpenAIEngineConfig(model="m", base_url=server.base_url))
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Answer:
    """What the fake server sends for one request."""

    status: int = 200
    body: bytes = b""
    delay_s: float = 0.0
    content_type: str = "application/json"


Step = Callable[[dict[str, Any]], Answer]
"""A script step: gets the request's JSON body, returns the answer."""


def chat_json(text: str | None, *, model: str = "fake-model", token_ids: list[int] | None = None,
              logprobs: list[float] | None = None, finish_reason: str = "stop") -> dict[str, Any]:
    """A chat.completion body as OpenAI-compatible servers send it (llama.cpp style `id` per token)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason,
                              "message": {"role": "assistant", "content": text}}
    if logprobs is not None:
        ids = token_ids if token_ids is not None else [None] * len(logprobs)
        choice["logprobs"] = {"content": [
            {"token": f"t{i}", "logprob": lp, "bytes": None, "top_logprobs": [],
             **({"id": tid} if tid is not None else {})}
            for i, (tid, lp) in enumerate(zip(ids, logprobs, strict=True))]}
    completion_tokens = len(logprobs) if logprobs is not None else len((text or "").split())
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
            "choices": [choice],
            "usage": {"prompt_tokens": 7, "completion_tokens": completion_tokens,
                      "total_tokens": 7 + completion_tokens}}


def reply(text: str | None, **kwargs: Any) -> Step:
    """Answer 200 with a chat completion whose content is `text` (None gives a null content)."""
    return lambda _request: Answer(body=json.dumps(chat_json(text, **kwargs)).encode())


def echo() -> Step:
    """Answer 200 with the last user message as content: shows what was sent."""
    return lambda request: Answer(body=json.dumps(chat_json(request["messages"][-1]["content"])).encode())


def status(code: int, message: str = "scripted failure") -> Step:
    """Answer with an HTTP error status and an OpenAI-style error body."""
    body = json.dumps({"error": {"message": message, "type": "test", "code": code}}).encode()
    return lambda _request: Answer(status=code, body=body)


def raw(body: bytes | str, *, code: int = 200, content_type: str = "application/json") -> Step:
    """Answer with exactly these bytes (malformed JSON, `{"choices": []}`, ...)."""
    data = body.encode() if isinstance(body, str) else body
    return lambda _request: Answer(status=code, body=data, content_type=content_type)


def slow(seconds: float, then: Step) -> Step:
    """Wait `seconds` before answering with `then`."""

    def step(request: dict[str, Any]) -> Answer:
        answer = then(request)
        answer.delay_s = seconds
        return answer

    return step


@dataclass
class FakeOpenAIServer:
    """A ThreadingHTTPServer on 127.0.0.1 that serves /v1/chat/completions from a script."""

    script: list[Step]
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    _closing: threading.Event = field(default_factory=threading.Event)
    _httpd: http.server.ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self._httpd is not None
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _next_step(self, request: dict[str, Any]) -> Answer:
        index = min(len(self.requests), len(self.script) - 1)
        self.requests.append(request)
        return self.script[index](request)

    def start(self) -> FakeOpenAIServer:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(Answer(body=json.dumps({"object": "list", "data": [
                        {"id": "fake-model", "object": "model"}]}).encode()))
                else:
                    self._send(Answer(status=404, body=b'{"error": {"message": "not found"}}'))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                payload = self.rfile.read(length)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(Answer(status=404, body=b'{"error": {"message": "not found"}}'))
                    return
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                answer = server._next_step(json.loads(payload))
                if answer.delay_s and server._closing.wait(answer.delay_s):
                    return
                self._send(answer)

            def _send(self, answer: Answer) -> None:
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", answer.content_type)
                    self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="fake-openai", daemon=True).start()
        return self

    def close(self) -> None:
        self._closing.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


@contextlib.contextmanager
def fake_openai_server(*script: Step) -> Iterator[FakeOpenAIServer]:
    """A running fake server for the duration of the `with` block."""
    server = FakeOpenAIServer(list(script) or [reply("ok")]).start()
    try:
        yield server
    finally:
        server.close()


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- llama.cpp's real server --------------------------------------------------------------------------------


@dataclass
class LlamaCppServerProcess:
    """A `python -m agentflow.engines.llamacpp --serve` subprocess."""

    process: subprocess.Popen[str]
    base_url: str
    stderr_path: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.stderr_path)


def start_llamacpp_server(port: int = 0, *, model: str | None = None, n_parallel: int = 2, n_ctx: int = 4096,
                          threads: int = 1, api_key: str | None = None,
                          timeout_s: float = 60.0) -> LlamaCppServerProcess:
    """Launch llama.cpp's OpenAI-compatible server in a subprocess; return once /v1/models answers.

    `port=0` lets the server pick a free port (read back from its first line of output).
    """
    stderr = tempfile.NamedTemporaryFile("w", prefix="llamacpp-server-", suffix=".log", delete=False)
    command = [sys.executable, "-m", "agentflow.engines.llamacpp", "--serve", "--port", str(port),
               "--n-parallel", str(n_parallel), "--n-ctx", str(n_ctx), "--threads", str(threads)]
    if model:
        command += ["--model", model]
    if api_key:
        command += ["--api-key", api_key]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    stderr.close()
    server = LlamaCppServerProcess(process, "", stderr.name)
    try:
        server.base_url = _wait_for_address(process, timeout_s) + "/v1"
        _wait_for_models(server, api_key, timeout_s)
    except RuntimeError as err:
        with open(stderr.name) as log_file:
            log_tail = log_file.read()[-2000:]
        server.stop()
        raise RuntimeError(f"{err}\n--- server stderr ---\n{log_tail}") from None
    except BaseException:
        server.stop()
        raise
    return server


def _wait_for_address(process: subprocess.Popen[str], timeout_s: float) -> str:
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:  # drains stdout until the process exits, then closes it
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if process.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited with code {process.returncode}") from None
            continue
        if line.startswith("listening on "):
            return line.split()[2].removesuffix("/v1")
    raise RuntimeError(f"llama.cpp server did not start within {timeout_s}s")


def _wait_for_models(server: LlamaCppServerProcess, api_key: str | None, timeout_s: float) -> None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"llama.cpp server exited with code {server.process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.base_url}/models", headers=headers, timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"llama.cpp server at {server.base_url} did not answer /v1/models within {timeout_s}s")


@contextlib.contextmanager
def llamacpp_server(**kwargs: Any) -> Iterator[LlamaCppServerProcess]:
    """A running llama.cpp server for the duration of the `with` block; killed afterwards."""
    server = start_llamacpp_server(**kwargs)
    try:
        yield server
    finally:
        server.stop()

"""Embedded llama.cpp through `xllamacpp`: llama.cpp's own server, in-process, with no server to start.

Why xllamacpp and not llama-cpp-python: xllamacpp ships prebuilt CPU wheels (installs in seconds), while
llama-cpp-python is source-only on PyPI and compiles for about 14 minutes on 2 cores. It also wraps llama.cpp's
C++ server, so concurrent requests decode together in parallel slots (continuous batching) and JSON-schema
constrained decoding comes for free.

The same module doubles as a real OpenAI-compatible HTTP server (llama.cpp's own):

    python -m agentflow.engines.llamacpp --serve --port 8080

serves the bundled model at http://127.0.0.1:8080/v1 until interrupted.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentflow.bundled import bundled_model_path
from agentflow.clock import SharedCompute, waiting_for_capacity
from agentflow.config import LlamaCppEngineConfig
from agentflow.engines.base import Completion, Engine, Message, SamplingParams
from agentflow.errors import (
    ConfigError,
    EngineBadRequestError,
    EngineError,
    EngineRateLimitError,
    EngineResponseError,
    EngineServerError,
    EngineUnavailableError,
    ModelNotFoundError,
    bad_request_error,
)

log = logging.getLogger(__name__)

#: llama.cpp's server adds top_k=40 and min_p=0.05 unless told otherwise. We switch them off so that the
#: sampling distribution is exactly softmax(logits / temperature) truncated by top_p: the settings sent are
#: the settings that act, and the returned log-probs are comparable with a trainer's recomputation.
NEUTRAL_SAMPLER: dict[str, Any] = {"top_k": 0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0}

#: llama.cpp verbosity levels (its `-lv` flag): 0 = nothing but generic output, 3 = info.
_QUIET, _INFO = 0, 3


def default_threads() -> int:
    """CPU threads for llama.cpp: half the cores this process may use, at least 1 and at most 4.

    Half, because llama.cpp's OpenMP threads spin at every barrier: when another process (torch, a tool's
    subprocess, a second engine) takes a core they wait whole time slices for each other, and decoding
    collapses (measured on 2 cores under load: 2 threads 1.3 tokens/s, 1 thread 40 tokens/s; docs/engines.md).
    More than 4 threads gains little for small models.
    """
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    return max(1, min(4, available // 2))


def resolve_model_path(model_path: str | None) -> Path:
    """The GGUF file to load: the configured one, or the bundled SmolLM2. Missing files fail here, clearly."""
    if model_path is None:
        return bundled_model_path()
    path = Path(model_path).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF model file not found: {path}")
    return path


def engine_model_path(config: LlamaCppEngineConfig) -> Path:
    """The GGUF file an engine loads: `resolve_model_path`, re-quantised when the config asks for it."""
    path = resolve_model_path(config.model_path)
    if config.requantize == "q8_0":
        from agentflow.train.export import requantized_q8_0

        path = requantized_q8_0(path)
    return path


def _build_params(config: LlamaCppEngineConfig, model_path: Path, n_threads: int, *, port: int = 0,
                  host: str = "127.0.0.1", api_key: str | None = None, alias: str | None = None) -> Any:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model_path)
    params.n_ctx = config.n_ctx
    params.n_parallel = config.n_parallel
    params.n_gpu_layers = config.n_gpu_layers
    params.cpuparams.n_threads = n_threads
    params.cpuparams_batch.n_threads = n_threads
    params.warmup = False  # the first request warms up; loading stays ~0.5 s
    params.verbosity = _INFO if log.isEnabledFor(logging.DEBUG) else _QUIET
    params.hostnames = [host]
    params.port = port
    if api_key:
        params.api_keys = [api_key]
    if alias:
        params.model_alias = {alias}
    params.endpoint_metrics = True
    return params


class LlamaCppEngine(Engine):
    """A GGUF model run in-process by llama.cpp, shared by all concurrent calls.

    The model loads lazily on the first call (about 0.5 s for the bundled model) and once only. Each call runs
    llama.cpp's blocking handler in a worker thread (it releases the GIL), so up to `n_parallel` requests
    decode together in llama.cpp's slots; more wait in llama.cpp's queue.

    Log-probs: at temperature > 0 each returned log-prob is that of the sampled token under the distribution
    it was drawn from, softmax(logits / T) restricted to the top-p nucleus and renormalised (llama.cpp's
    post-sampling probabilities). At temperature 0 (greedy) that distribution is a point mass, so the raw
    model log-prob (T = 1) is returned instead.

    Token ids: `token_ids` are the generated tokens. `prompt_token_ids` is None: llama.cpp's chat endpoint
    does not return the tokenised prompt.

    Capacity: at most `n_parallel` requests are handed to llama.cpp at once (one per slot); the others wait
    here, and that wait is marked as waiting for capacity (`agentflow.clock`), so a question's time limit does
    not count it. Cancelling a call (e.g. a question's time limit) stops its request inside llama.cpp at the
    next token: replies are streamed, and the stream is abandoned, which frees the slot for the next request.
    """

    supports_json_schema = True

    def __init__(self, config: LlamaCppEngineConfig | None = None) -> None:
        self.config = config or LlamaCppEngineConfig()
        self.model_path = engine_model_path(self.config)
        self.model_name = self.model_path.stem  # as llama.cpp's server names it at /v1/models
        self.n_threads = self.config.n_threads or default_threads()
        self._server: Any = None
        self._load_lock = threading.Lock()
        self._closed = False
        # One thread per slot: llama.cpp never queues a request of ours; the rest wait on `_slots`.
        self._executor = ThreadPoolExecutor(max_workers=self.config.n_parallel, thread_name_prefix="llamacpp")
        self._slots: asyncio.Semaphore | None = None
        self._compute = SharedCompute()
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self.load_seconds: float | None = None
        self._adapter_file: Path | None = None

    # -- loading -------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Load the model now (idempotent, thread-safe). `generate` calls it on first use."""
        with self._load_lock:
            if self._server is not None:
                return
            if self._closed:
                raise EngineUnavailableError("the llama.cpp engine is closed")
            import xllamacpp

            # The in-process server also listens on 127.0.0.1 (an ephemeral port): a random API key keeps
            # that listener private; direct calls do not need it.
            params = _build_params(self.config, self.model_path, self.n_threads,
                                   api_key=secrets.token_urlsafe(24))
            self._tune_params(params)
            adapters = self.lora_files()
            if adapters:
                params.lora_adapters = [xllamacpp.CommonAdapterLoraInfo(str(path), scale)
                                        for path, scale in adapters]
            started = time.perf_counter()
            try:
                self._server = xllamacpp.Server(params)
            except RuntimeError as err:  # xllamacpp gives no detail; retrying would not help
                adapter = f" with the adapters {[str(p) for p, _ in adapters]}" if adapters else ""
                raise ConfigError(f"llama.cpp could not load {self.model_path}{adapter}: not a valid GGUF file, "
                                  f"or too large for memory (set logging to DEBUG to see llama.cpp's log)") from err
            self.load_seconds = time.perf_counter() - started
            log.info("llama.cpp loaded %s in %.2fs (n_ctx=%d, n_parallel=%d, n_threads=%d)", self.model_name,
                     self.load_seconds, self.config.n_ctx, self.config.n_parallel, self.n_threads)

    def _tune_params(self, params: Any) -> None:
        """Adjust llama.cpp's parameters before the model loads (a subclass's hook)."""

    def lora_files(self) -> list[tuple[Path, float]]:
        """The llama.cpp LoRA files to load over the model, each with its default scale: the config's
        `adapter` (the trainer's rollout engine loads its own)."""
        if self.config.adapter is None:
            return []
        if self._adapter_file is None:
            from agentflow.bundled import resolve_adapter
            from agentflow.train.export import adapter_lora_gguf

            self._adapter_file = adapter_lora_gguf(resolve_adapter(self.config.adapter), template=self.model_path)
        return [(self._adapter_file, 1.0)]

    def reload(self) -> None:
        """Free the model and load it again (with the current `lora_files`); no request may be running."""
        with self._load_lock:
            self._server = None
        self.load()

    # -- generation ----------------------------------------------------------------------------------------

    def request_body(self, messages: list[Message], sampling: SamplingParams,
                     json_schema: dict[str, Any] | None = None) -> dict[str, Any]:
        """The OpenAI-style request sent to llama.cpp: the given settings, plus a neutral sampler chain."""
        body: dict[str, Any] = {
            "messages": messages,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            **NEUTRAL_SAMPLER,
            "logprobs": True,
            # post-sampling probabilities are those of the distribution actually sampled from
            "post_sampling_probs": sampling.temperature > 0,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = sampling.stop
        if json_schema is not None:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "reply", "schema": json_schema, "strict": True}}
        return body

    def _call(self, body: dict[str, Any], cancelled: threading.Event) -> dict[str, Any]:
        """Stream one request through llama.cpp (in a worker thread) and assemble the reply as llama.cpp's
        non-streaming answer would be; stop the stream as soon as `cancelled` is set."""
        self.load()
        reply = _StreamedReply()

        def on_chunk(chunk: Any) -> bool:
            if cancelled.is_set():
                return True  # llama.cpp cancels the request and frees its slot
            reply.add(chunk)
            return False

        try:
            self._server.handle_chat_completions({**body, "stream": True, "stream_options": {"include_usage": True}},
                                                 on_chunk)
        except ValueError as err:  # request validation: bad messages, unsupported schema, template failure
            raise EngineBadRequestError(f"llama.cpp refused the request: {err}") from err
        except Exception as err:
            raise EngineServerError(f"llama.cpp failed: {type(err).__name__}: {err}") from err
        return reply.response()

    def _capacity(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:  # one per event loop (tests run several)
            self._slots, self._slots_loop = asyncio.Semaphore(self.config.n_parallel), loop
        return self._slots

    async def generate(self, messages: list[Message], sampling: SamplingParams, *,
                       json_schema: dict[str, Any] | None = None) -> Completion:
        if self._closed:
            raise EngineUnavailableError("the llama.cpp engine is closed")
        body = self.request_body(messages, sampling, json_schema)
        slots = self._capacity()
        with waiting_for_capacity():
            await slots.acquire()
        cancelled = threading.Event()
        try:
            started = time.perf_counter()
            with self._compute.served():  # the slots decode together on the same threads
                response = await asyncio.get_running_loop().run_in_executor(self._executor, self._call, body,
                                                                            cancelled)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        finally:
            slots.release()
        seconds = time.perf_counter() - started
        completion = parse_chat_response(response, model=self.model_name, seconds=seconds)
        timings = response.get("timings") or {}
        log.debug("llama.cpp: %d prompt tokens (%d cached) in %.0f ms, %d generated in %.0f ms",
                  completion.prompt_tokens, timings.get("cache_n", 0), timings.get("prompt_ms", 0.0),
                  completion.completion_tokens, timings.get("predicted_ms", 0.0))
        return completion

    def metrics(self) -> dict[str, float]:
        """llama.cpp's server counters (Prometheus names without the `llamacpp:` prefix), e.g.
        `n_busy_slots_per_decode` (> 1 when concurrent requests decode together), `requests_processing`."""
        self.load()
        values: dict[str, float] = {}
        for line in self._server.handle_metrics().splitlines():
            if line.startswith("llamacpp:"):
                name, _, value = line.removeprefix("llamacpp:").partition(" ")
                values[name] = float(value)
        return values

    async def aclose(self) -> None:
        """Wait for running requests, then free the model."""
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._shutdown)

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=True)
        with self._load_lock:
            self._server = None  # the destructor stops llama.cpp's loop and frees the model

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "llamacpp",
            "model": self.model_name,
            "model_path": str(self.model_path),
            **({"adapter": self.config.adapter} if self.config.adapter else {}),
            "n_ctx": self.config.n_ctx,
            "n_parallel": self.config.n_parallel,
            "n_threads": self.n_threads,
            "n_gpu_layers": self.config.n_gpu_layers,
            "sampler": dict(NEUTRAL_SAMPLER),
            "logprobs": "post-sampling (temperature, top_p); raw model log-probs when greedy",
        }


class _StreamedReply:
    """Chunks of a streamed chat completion, put back together as llama.cpp's non-streaming reply."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.logprobs: list[Any] = []
        self.last: dict[str, Any] = {}
        self.finish_reason: str | None = None
        self.error: Any = None

    def add(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            self.error = self.error or {"code": 500, "message": f"llama.cpp streamed {type(chunk).__name__}"}
            return
        if "error" in chunk or ("choices" not in chunk and "message" in chunk):
            self.error = chunk.get("error", chunk)
            return
        self.last = chunk
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.text.append(delta["content"])
            content = (choice.get("logprobs") or {}).get("content")
            if isinstance(content, list):
                self.logprobs.extend(content)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def response(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        if not self.last:
            return {}
        return {"choices": [{"message": {"content": "".join(self.text)}, "finish_reason": self.finish_reason,
                             "logprobs": {"content": self.logprobs} if self.logprobs else None}],
                "usage": self.last.get("usage"), "timings": self.last.get("timings")}


def _error_for_status(status: int, message: str) -> EngineError:
    if status == 429:
        return EngineRateLimitError(message)
    if status == 503:
        return EngineUnavailableError(message)
    if status >= 500:
        return EngineServerError(message)
    return bad_request_error(message)


def parse_completion_error(response: Any) -> None:
    """Raise the EngineError matching a llama.cpp reply that is an error, or not a JSON object."""
    if not isinstance(response, dict):
        raise EngineResponseError(f"llama.cpp returned {type(response).__name__}, not a JSON object")
    error = response.get("error")
    if error is None and "choices" not in response and "message" in response:
        error = response  # xllamacpp reports its own failures as a bare {"code", "type", "message"}
    if error is not None:
        if not isinstance(error, dict):
            raise EngineServerError(f"llama.cpp error: {error}")
        status = int(error.get("code") or 500)
        raise _error_for_status(status, f"llama.cpp error {status} ({error.get('type', '?')}): "
                                        f"{error.get('message', '')}")


def parse_chat_response(response: Any, *, model: str, seconds: float) -> Completion:
    """Turn llama.cpp's chat-completion dict into a Completion, or raise the matching EngineError."""
    parse_completion_error(response)
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise EngineResponseError("llama.cpp reply has no choices")
    choice = choices[0]
    message = choice.get("message") or {}
    text = message.get("content")
    if not isinstance(text, str):
        raise EngineResponseError(f"llama.cpp reply has no text content (finish_reason={choice.get('finish_reason')})")
    token_ids, logprobs = _token_logprobs(choice.get("logprobs"))
    usage = response.get("usage") or {}
    return Completion(
        text=text,
        finish_reason=choice.get("finish_reason"),
        model=model,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_prompt_tokens=cached_tokens(response),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        seconds=seconds,
        token_ids=token_ids,
        logprobs=logprobs,
    )


def cached_tokens(response: Any) -> int | None:
    """The prompt tokens llama.cpp reused from a cached prompt (`timings.cache_n`), if it reports them."""
    cached = (response.get("timings") or {}).get("cache_n")
    return int(cached) if isinstance(cached, (int, float)) else None


def _token_logprobs(logprobs: Any) -> tuple[list[int] | None, list[float] | None]:
    """Token ids and log-probs from llama.cpp's `logprobs.content` (log-probs, or probs when post-sampling)."""
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
        return None, None
    ids: list[int] = []
    values: list[float] = []
    for entry in logprobs["content"]:
        ids.append(int(entry["id"]))
        if "logprob" in entry:
            values.append(float(entry["logprob"]))
        else:  # post-sampling: a probability; the sampled token always has one > 0, up to float underflow
            values.append(math.log(max(float(entry["prob"]), 1e-45)))
    return ids, values


# -- the HTTP server entry point --------------------------------------------------------------------------


def serve(config: LlamaCppEngineConfig, *, host: str = "127.0.0.1", port: int = 8080,
          api_key: str | None = None, alias: str | None = None, ready: threading.Event | None = None,
          stop: threading.Event | None = None) -> None:
    """Run llama.cpp's OpenAI-compatible HTTP server until `stop` is set (or forever). Blocks.

    `port=0` picks a free port; the address is logged and printed once the model is loaded.
    """
    import xllamacpp
    from rich.console import Console

    model_path = engine_model_path(config)
    n_threads = config.n_threads or default_threads()
    params = _build_params(config, model_path, n_threads, port=port, host=host, api_key=api_key,
                           alias=alias or model_path.stem)
    server = xllamacpp.Server(params)
    address = server.listening_address
    log.info("llama.cpp server for %s listening on %s", model_path.name, address)
    Console(highlight=False, soft_wrap=True).print(f"listening on {address}/v1 (model {alias or model_path.stem})",
                                                   markup=False)
    if ready is not None:
        ready.set()
    stop = stop or threading.Event()
    while not stop.wait(0.5):  # short waits keep the main thread responsive to signals
        pass
    del server


def main(argv: list[str] | None = None) -> None:
    """`python -m agentflow.engines.llamacpp --serve`: a real llama.cpp OpenAI-compatible server."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m agentflow.engines.llamacpp",
                                     description="Serve a GGUF model (default: the bundled SmolLM2) over "
                                                 "llama.cpp's OpenAI-compatible HTTP API.")
    parser.add_argument("--serve", action="store_true", required=True, help="run the HTTP server")
    parser.add_argument("--model", default=None, help="GGUF file (default: bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--api-key", default=None, help="require this bearer token")
    parser.add_argument("--alias", default=None, help="model name served at /v1/models (default: file stem)")
    parser.add_argument("--n-ctx", type=int, default=LlamaCppEngineConfig.model_fields["n_ctx"].default)
    parser.add_argument("--n-parallel", type=int,
                        default=LlamaCppEngineConfig.model_fields["n_parallel"].default)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = LlamaCppEngineConfig(model_path=args.model, n_ctx=args.n_ctx, n_parallel=args.n_parallel,
                                  n_threads=args.threads)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve(config, host=args.host, port=args.port, api_key=args.api_key, alias=args.alias, stop=stop)
    except ModelNotFoundError as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()

"""Hugging Face transformers (+ PEFT): the trainable planner's engine.

Loads a local checkpoint directory or a GGUF file (default: the bundled SmolLM2 GGUF). A GGUF is dequantised
once (about 30 s) and cached as safetensors under `cache_dir()/hf-from-gguf/`, keyed by the file's size and
modification time, so later loads take well under a second.

Concurrent `generate` calls are batched: a worker thread collects pending requests, groups those with
identical sampling settings and JSON schema, and runs one left-padded `model.generate` per group (at most
`max_batch_size` rows). A JSON schema constrains decoding (llguidance, see `engines/constrained.py`).
The trainer shares the same model object: it updates weights inside `engine.updating_weights()`, which waits
for a running batch and blocks new ones until the step is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentflow.bundled import bundled_model_path, cache_dir, resolve_adapter
from agentflow.clock import SharedCompute
from agentflow.config import TransformersEngineConfig
from agentflow.engines.base import Completion, Engine, Message, SamplingParams
from agentflow.engines.constrained import SchemaConstraints
from agentflow.errors import (
    ConfigError,
    EngineContextOverflowError,
    EngineError,
    EngineServerError,
    EngineUnavailableError,
    ModelNotFoundError,
)

log = logging.getLogger(__name__)

#: How long the batcher waits after the first request for others to join its batch. Rollouts of one group
#: arrive within microseconds of each other; a few milliseconds is negligible next to a generate call.
BATCH_WAIT_S = 0.01

GGUF_CACHE_SUBDIR = "hf-from-gguf"


# -- loading --------------------------------------------------------------------------------------------------


def resolve_device(device: str) -> torch.device:
    """'auto' means CUDA when available, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' means bfloat16 on a CUDA device that supports it, float32 otherwise."""
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def resolve_model_source(model: str | None) -> Path:
    """The checkpoint directory or GGUF file to load; the bundled GGUF by default. Missing paths fail here."""
    if model is None:
        return bundled_model_path()
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return path
    raise ModelNotFoundError(
        f"{model}: not a local Hugging Face checkpoint directory (with config.json) nor a .gguf file; "
        "nothing is downloaded at run time")


@contextlib.contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def gguf_checkpoint(gguf_path: Path, *, root: Path | None = None) -> Path:
    """A safetensors checkpoint converted from `gguf_path`, created on first use and cached.

    The key is the file's name, size and modification time, so a replaced file is converted again.
    Conversion writes to a temporary directory and renames it, so concurrent processes never see half a
    checkpoint.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stat = gguf_path.stat()
    root = root or cache_dir() / GGUF_CACHE_SUBDIR
    target = root / f"{gguf_path.stem}-{stat.st_size}-{stat.st_mtime_ns}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    log.info("converting %s to a transformers checkpoint (once; cached at %s)", gguf_path.name, target)
    started = time.perf_counter()
    with _quiet_progress_bars():
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                     dtype=torch.float32)
        # The weights are plain dequantised tensors; only the GGUF marker blocks save_pretrained.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
        try:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            staging.chmod(0o755)  # mkdtemp makes it private; the cache is as readable as any checkpoint
            try:
                staging.rename(target)
            except OSError:  # another process finished first; its copy is as good as ours
                if not (target / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    log.info("converted %s in %.1fs", gguf_path.name, time.perf_counter() - started)
    return target


def load_policy(config: TransformersEngineConfig | None = None, *, trainable: bool = False) -> tuple[Any, Any]:
    """Load (model, tokenizer) as the engine does; the trainer calls this to build its policy and reference.

    The tokenizer pads on the left (for batched generation) and has a pad token. With `config.adapter`, the
    model is a PeftModel; `trainable=True` keeps the adapter's weights trainable.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = config or TransformersEngineConfig()
    if config.n_threads:
        torch.set_num_threads(config.n_threads)
    source = resolve_model_source(config.model)
    adapter = resolve_adapter(config.adapter) if config.adapter else None
    checkpoint = gguf_checkpoint(source) if source.is_file() else source
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    started = time.perf_counter()
    with _quiet_progress_bars():
        tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, local_files_only=True)
    model.to(device)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter, is_trainable=trainable)
    model.train(trainable)
    prepare_tokenizer(tokenizer)
    log.info("loaded %s (%s, %s) in %.2fs", checkpoint.name, device, dtype, time.perf_counter() - started)
    return model, tokenizer


def prepare_tokenizer(tokenizer: Any) -> None:
    """Left padding and a pad token: what batched generation needs."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token


# -- the engine -----------------------------------------------------------------------------------------------


@dataclass
class _Request:
    messages: list[Message]
    sampling: SamplingParams
    json_schema: dict[str, Any] | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Completion]
    adapter: str | None = None
    submitted: float = field(default_factory=time.perf_counter)

    @property
    def group(self) -> str:
        return self.sampling.model_dump_json() + json.dumps(self.json_schema, sort_keys=True) + str(self.adapter)


_STOP = object()


class TransformersEngine(Engine):
    """A transformers causal LM behind the Engine interface, with request batching.

    Log-probs: each returned log-prob is that of the sampled token under the distribution it was drawn from:
    log softmax of logits / temperature over the tokens allowed to be drawn, i.e. within the top-p nucleus
    (renormalised) and, under a JSON schema, within the tokens the schema allows next (see
    `engines/constrained.py`; a token the schema forces has log-prob 0). With top_p = 1 a trainer recomputes
    the same numbers from the ids (`allowed_tokens` rebuilds the schema's masks). At temperature 0 (greedy)
    they are the (masked) raw model log-probs (T = 1). Token ids run up to and including the first
    end-of-sequence token, which is part of what the policy chose; padding after it is dropped.

    Randomness: unseeded requests draw from the engine's own random stream, which continues from one
    `generate` call to the next (so repeated prompts get fresh samples) and never disturbs the process-wide
    torch RNG. It starts from `config.seed` (`seed_sampling` restarts it; a trainer passes its run seed) or,
    without one, from fresh OS entropy; `sampling_state` / `load_sampling_state` save and restore it, so a
    resumed training run continues the same stream. A request with its own `seed` is drawn under that seed
    alone (the same requests in the same batch reproduce) and leaves the stream untouched.
    """

    def __init__(self, config: TransformersEngineConfig | None = None, *, model: Any = None,
                 tokenizer: Any = None, batch_wait_s: float = BATCH_WAIT_S) -> None:
        self.config = config or TransformersEngineConfig()
        if (model is None) != (tokenizer is None):
            raise ValueError("give both model and tokenizer, or neither")
        self.source: Path | None = None if model is not None else resolve_model_source(self.config.model)
        if self.source is not None:
            self.model_name = self.source.stem if self.source.is_file() else self.source.name
        else:
            self.model_name = self.config.model or str(getattr(model, "name_or_path", "") or type(model).__name__)
        self.supports_json_schema = self.config.json_schema
        self._constraints: SchemaConstraints | None = None
        self._constraints_lock = threading.Lock()
        self.device = resolve_device(self.config.device)
        self.dtype = resolve_dtype(self.config.dtype, self.device)
        self._model = model
        self._tokenizer = tokenizer
        if tokenizer is not None:
            prepare_tokenizer(tokenizer)
        self.batch_wait_s = batch_wait_s
        self.weights_lock = threading.RLock()
        """Held while a batch generates; hold it (see `updating_weights`) while changing weights."""
        self.weights_version = 0
        self.load_seconds: float | None = None
        self._load_lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._compute = SharedCompute()
        self._worker: threading.Thread | None = None
        self._closed = False
        self.batch_sizes: list[int] = []
        """Rows of each generate call so far (for tests and benchmarks)."""
        self._sampling_state: dict[str, torch.Tensor] | None = None
        seed = self.config.seed if self.config.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
        self.seed_sampling(seed)

    # -- model access ------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Load the model and tokenizer now (idempotent, thread-safe). Generation loads them on first use."""
        with self._load_lock:
            if self._model is not None:
                return
            started = time.perf_counter()
            self._model, self._tokenizer = load_policy(self.config)
            self._model.eval()
            self.load_seconds = time.perf_counter() - started

    @property
    def model(self) -> Any:
        """The model that generates (loaded on first access). The trainer may update its weights in place."""
        self.load()
        return self._model

    @property
    def tokenizer(self) -> Any:
        self.load()
        return self._tokenizer

    @contextlib.contextmanager
    def updating_weights(self) -> Iterator[Any]:
        """Hold generation off while the caller changes the weights (an optimizer step, loading a state)."""
        with self.weights_lock:
            yield self.model
        self.weights_updated()

    def weights_updated(self) -> None:
        """Record that the weights changed: later completions come from the new policy."""
        self.weights_version += 1
        log.debug("policy weights updated (version %d)", self.weights_version)

    # -- the sampling stream ----------------------------------------------------------------------------------

    def _rng_devices(self) -> list[torch.device]:
        return [self.device] if self.device.type == "cuda" else []

    def _capture_rng(self) -> dict[str, torch.Tensor]:
        state = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def _restore_rng(self, state: dict[str, torch.Tensor]) -> None:
        torch.set_rng_state(state["cpu"])
        if self.device.type == "cuda" and "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], self.device)

    def seed_sampling(self, seed: int) -> None:
        """Restart the engine's sampling stream from `seed`."""
        with torch.random.fork_rng(devices=self._rng_devices()):
            torch.manual_seed(seed)
            self._sampling_state = self._capture_rng()

    def sampling_state(self) -> dict[str, torch.Tensor]:
        """The sampling stream's current state (for checkpoints)."""
        assert self._sampling_state is not None
        return {key: value.clone() for key, value in self._sampling_state.items()}

    def load_sampling_state(self, state: dict[str, torch.Tensor]) -> None:
        """Continue the sampling stream from a state `sampling_state` returned."""
        self._sampling_state = {key: value.clone() for key, value in state.items()}

    # -- generation -------------------------------------------------------------------------------------------

    async def generate(self, messages: list[Message], sampling: SamplingParams, *,
                       json_schema: dict[str, Any] | None = None, adapter: str | None = None) -> Completion:
        """`adapter`: the PEFT adapter that answers (its name; `BASE_ADAPTER`: none), for a model holding one
        LoRA adapter per role; None: the model as it is (its active adapter, if any)."""
        if self._closed:
            raise EngineUnavailableError("the transformers engine is closed")
        self._ensure_worker()
        loop = asyncio.get_running_loop()
        schema = json_schema if self.supports_json_schema else None
        request = _Request(messages=messages, sampling=sampling, json_schema=schema, loop=loop,
                           future=loop.create_future(), adapter=adapter)
        with self._compute.served():  # queued behind a batch or decoded in one, it shares the engine
            self._queue.put(request)
            return await request.future

    def _ensure_worker(self) -> None:
        with self._load_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="hf-batcher", daemon=True)
                self._worker.start()

    def _work(self) -> None:
        pending: list[_Request] = []
        while True:
            if not pending:
                item = self._queue.get()
                if item is _STOP:
                    return
                pending.append(item)
                time.sleep(self.batch_wait_s)  # let the rest of a burst arrive
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    for request in pending:
                        _resolve(request, EngineUnavailableError("the transformers engine was closed"))
                    return
                pending.append(item)
            pending = [r for r in pending if not r.future.done()]  # cancelled while waiting
            if not pending:
                continue
            group = pending[0].group
            batch = [r for r in pending if r.group == group][: self.config.max_batch_size]
            pending = [r for r in pending if r not in batch]
            self._run_batch(batch)

    def _run_batch(self, batch: list[_Request]) -> None:
        try:
            self.load()
            results: list[Completion | Exception] = self._generate_batch(batch)
        except (EngineError, ConfigError) as err:
            results = [err] * len(batch)
        except Exception as err:  # a bug or an out-of-memory: fail these requests, keep serving others
            log.exception("transformers generate failed")
            results = [EngineServerError(f"transformers generate failed: {type(err).__name__}: {err}")] * len(batch)
        for request, result in zip(batch, results, strict=True):
            _resolve(request, result)

    def _generate_batch(self, batch: list[_Request]) -> list[Completion | EngineError]:
        tokenizer, sampling, schema = self._tokenizer, batch[0].sampling, batch[0].json_schema
        prompts: list[list[int]] = []
        for request in batch:
            text = tokenizer.apply_chat_template(request.messages, tokenize=False, add_generation_prompt=True)
            prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        limit = getattr(self._model.config, "max_position_embeddings", None)
        results: list[Completion | EngineError | None] = [None] * len(batch)
        rows: list[int] = []
        for i, ids in enumerate(prompts):
            if limit and len(ids) + sampling.max_tokens > limit:
                results[i] = EngineContextOverflowError(
                    f"prompt ({len(ids)} tokens) + max_tokens ({sampling.max_tokens}) exceeds the model's "
                    f"context ({limit})")
            else:
                rows.append(i)
        if rows:
            started = time.perf_counter()
            outputs = self._sample([prompts[i] for i in rows], sampling, schema, adapter=batch[0].adapter)
            seconds = time.perf_counter() - started
            self.batch_sizes.append(len(rows))
            for i, (token_ids, logprobs, finish) in zip(rows, outputs, strict=True):
                text = tokenizer.decode(token_ids, skip_special_tokens=True)
                if finish == "stop_string":
                    text = _cut_at_stop(text, sampling.stop)
                results[i] = Completion(
                    text=text, finish_reason="length" if finish == "length" else "stop", model=self.model_name,
                    prompt_tokens=len(prompts[i]), completion_tokens=len(token_ids),
                    seconds=time.perf_counter() - batch[i].submitted, prompt_token_ids=prompts[i],
                    token_ids=token_ids, logprobs=logprobs)
            log.debug("generated a batch of %d in %.2fs", len(rows), seconds)
        return [r for r in results if r is not None]

    def _generation_config(self, sampling: SamplingParams) -> Any:
        from transformers import GenerationConfig

        greedy = sampling.temperature == 0.0
        # Every warper is set explicitly: unset values would be filled from the checkpoint's own defaults
        # (top_k=50, say), and the settings sent would not be the settings that act.
        return GenerationConfig(
            max_new_tokens=sampling.max_tokens, do_sample=not greedy,
            temperature=1.0 if greedy else sampling.temperature, top_p=sampling.top_p, top_k=0, min_p=None,
            typical_p=1.0, repetition_penalty=1.0, no_repeat_ngram_size=0, num_beams=1,
            eos_token_id=self._eos_ids(), pad_token_id=self._tokenizer.pad_token_id,
            output_scores=True, return_dict_in_generate=True, use_cache=True)

    def _sample(self, prompts: list[list[int]], sampling: SamplingParams, schema: dict[str, Any] | None = None,
                *, adapter: str | None = None) -> list[tuple[list[int], list[float], str]]:
        """One left-padded generate call (every row through `adapter`, if given). Returns per row: token ids,
        their log-probs, why it ended."""
        tokenizer = self._tokenizer
        width = max(len(p) for p in prompts)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        config = self._generation_config(sampling)
        extra: dict[str, Any] = {"stopping_criteria": _stop_criteria(tokenizer, sampling.stop, width)} \
            if sampling.stop else {}
        if schema is not None:
            extra["logits_processor"] = [self._schema_constraints().processor(schema, len(prompts), width)]
        if adapter is not None:
            extra["adapter_names"] = [adapter] * len(prompts)  # PEFT's per-row adapter selection
        with self.weights_lock, torch.random.fork_rng(devices=self._rng_devices()), torch.inference_mode():
            seeded = sampling.seed is not None
            if seeded:
                torch.manual_seed(sampling.seed)
            else:
                assert self._sampling_state is not None
                self._restore_rng(self._sampling_state)
            was_training = self._model.training
            self._model.eval()
            try:
                with _without_model_defaults(self._model):
                    out = self._model.generate(input_ids=input_ids, attention_mask=attention,
                                               generation_config=config, **extra)
            finally:
                self._model.train(was_training)
            if not seeded:
                self._sampling_state = self._capture_rng()
        generated = out.sequences[:, width:]
        # `scores` are what each token was drawn from: logits after the schema mask, temperature and top-p
        steps = [torch.log_softmax(score.float(), dim=-1).gather(1, generated[:, t:t + 1]).squeeze(1)
                 for t, score in enumerate(out.scores)]
        chosen = torch.stack(steps, dim=1).tolist() if steps else [[] for _ in prompts]
        eos_ids = set(config.eos_token_id)
        results = []
        for row, ids in enumerate(generated.tolist()):
            end, finish = len(ids), "length"
            if sampling.stop:
                stop_end = _stop_string_end(tokenizer, ids, sampling.stop, eos_ids)
                if stop_end is not None:
                    end, finish = stop_end, "stop_string"
            if finish == "length":
                for position, token in enumerate(ids):
                    if token in eos_ids:
                        end, finish = position + 1, "eos"
                        break
            results.append((ids[:end], chosen[row][:end], finish))
        return results

    def _eos_ids(self) -> list[int]:
        eos = self._model.generation_config.eos_token_id
        return sorted({*([eos] if isinstance(eos, int) else eos or []), self._tokenizer.eos_token_id} - {None})

    def _schema_constraints(self) -> SchemaConstraints:
        with self._constraints_lock:
            if self._constraints is None:
                vocab = self._model.get_output_embeddings().weight.shape[0]
                self._constraints = SchemaConstraints(self._tokenizer, vocab, set(self._eos_ids()))
            return self._constraints

    def allowed_tokens(self, schema: dict[str, Any], token_ids: list[int]) -> torch.Tensor:
        """(len(token_ids), vocab) booleans: the tokens the schema allowed before each of `token_ids` was drawn.

        What a trainer needs to recompute the log-probs of a constrained reply under the distribution it was
        sampled from."""
        self.load()
        return torch.from_numpy(self._schema_constraints().replay(schema, token_ids))

    async def aclose(self) -> None:
        """Stop the batcher (pending requests fail with EngineUnavailableError). The model stays usable."""
        self._closed = True
        worker = self._worker
        if worker is not None and worker.is_alive():
            self._queue.put(_STOP)
            await asyncio.get_running_loop().run_in_executor(None, worker.join)

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "transformers",
            "model": self.model_name,
            "model_path": str(self.source) if self.source else None,
            "adapter": self.config.adapter,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "max_batch_size": self.config.max_batch_size,
            "weights_version": self.weights_version,
            "logprobs": "log softmax(logits / T) over the tokens that could be drawn (top-p nucleus, JSON-schema "
                        "mask); raw (masked) model log-probs when greedy",
            "json_schema": self.supports_json_schema,
        }


BASE_ADAPTER = "__base__"
"""PEFT's name for "no adapter" in a per-row adapter selection: the base model."""


class AdapterView(Engine):
    """One role's view of an engine whose model holds one LoRA adapter per role (a TransformersEngine, or the
    trainer's llama.cpp rollout engine): every request goes through `adapter` (`BASE_ADAPTER`: the base
    model), batched with the other requests for the same adapter. The model is shared; closing a view leaves
    it to the engine itself."""

    def __init__(self, engine: Any, adapter: str) -> None:
        self.engine = engine
        self.adapter = adapter
        self.model_name = engine.model_name
        self.supports_json_schema = engine.supports_json_schema

    async def generate(self, messages: list[Message], sampling: SamplingParams, *,
                       json_schema: dict[str, Any] | None = None) -> Completion:
        return await self.engine.generate(messages, sampling, json_schema=json_schema, adapter=self.adapter)

    def describe(self) -> dict[str, Any]:
        return {**self.engine.describe(), "adapter_name": self.adapter}


@contextlib.contextmanager
def _without_model_defaults(model: Any) -> Iterator[None]:
    """Generate with no sampling default of the checkpoint's own `generation_config` (its `min_p`, say).

    transformers fills every field our config leaves unset (None) from the model's generation config; a
    checkpoint's `min_p` or `top_h` would then act on rollouts but not on the trainer's recomputed log-probs.
    Only the token ids are kept.
    """
    from transformers import GenerationConfig

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    own = inner.generation_config
    inner.generation_config = GenerationConfig(
        bos_token_id=own.bos_token_id, eos_token_id=own.eos_token_id, pad_token_id=own.pad_token_id,
        decoder_start_token_id=own.decoder_start_token_id)
    try:
        yield
    finally:
        inner.generation_config = own


def _resolve(request: _Request, result: Completion | Exception) -> None:
    """Hand a result to the caller's event loop (it may be gone if the caller gave up)."""

    def settle() -> None:
        if request.future.done():
            return
        if isinstance(result, Exception):
            request.future.set_exception(result)
        else:
            request.future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed
        request.loop.call_soon_threadsafe(settle)


def _stop_criteria(tokenizer: Any, stops: list[str], prompt_width: int) -> Any:
    """Stop a row once its decoded reply contains a stop string.

    Our own criterion rather than transformers' `stop_strings`, which needs tokenizer internals that not every
    tokenizer has; it decodes just enough trailing tokens to contain the longest stop string.
    """
    from transformers import StoppingCriteria, StoppingCriteriaList

    window = max(len(stop) for stop in stops) + 1  # every token decodes to at least one character (specials aside)

    class StopOnStrings(StoppingCriteria):
        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
            tails = tokenizer.batch_decode(input_ids[:, prompt_width:][:, -window:], skip_special_tokens=True)
            done = [any(stop in tail for stop in stops) for tail in tails]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([StopOnStrings()])


def _stop_string_end(tokenizer: Any, ids: list[int], stops: list[str], eos_ids: set[int]) -> int | None:
    """Tokens up to and including the one that completed a stop string, or None if none occurs before eos."""
    text = ""
    for position, token in enumerate(ids):
        if token in eos_ids:
            return None
        text = tokenizer.decode(ids[: position + 1], skip_special_tokens=True)
        if any(stop in text for stop in stops):
            return position + 1
    return None


def _cut_at_stop(text: str, stops: list[str]) -> str:
    """The text before the first stop string (OpenAI servers leave the stop string out)."""
    cut = min((text.find(stop) for stop in stops if stop in text), default=len(text))
    return text[:cut]


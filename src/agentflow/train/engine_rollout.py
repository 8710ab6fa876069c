"""Rollouts of the trainable planner through llama.cpp, with the current LoRA adapter after every step.

The trainer owns the policy (a transformers model with a LoRA adapter) and computes every gradient; this
engine only samples. After each optimiser step `sync` writes the adapter as a llama.cpp LoRA file
(`export.write_lora_gguf`, about 10 MB at rank 16 for the bundled 135M model) and reloads llama.cpp with it
over a fixed base, so no rollout of step k+1 samples from the weights of step k. The base is the policy's
GGUF re-written with F16 matrices (`export.converted_gguf`): llama.cpp's log-probs then stay within a few
thousandths of a nat of the float32 trainer's, where the bundled Q4_1 file is ten times further off.

What goes in and comes out are token ids: the prompt is the trainer tokenizer's chat template (the same ids
the update feeds back), the reply is llama.cpp's sampled ids, never re-tokenised text. A JSON schema is
handed to llama.cpp as an llguidance grammar with the layout the transformers engine and the trainer's mask
replay use (`constrained.COMPACT_JSON`), so all three allow the same tokens.

Log-probs: llama.cpp reports, for each sampled token, its log-prob under the raw model distribution
(temperature 1, no grammar mask). Its post-sampling probabilities would not help: llama.cpp draws from the
unmasked distribution first and applies the grammar only when that draw is rejected, and reports the
distribution of whichever pass produced the token. The raw log-probs compare exactly with the trainer's raw
log-probs of the same ids; the trainer measures that gap and corrects for it (truncated importance sampling,
`update.py`). An end-of-sequence token ends llama.cpp's reply without being returned; it is appended here (it
is the policy's choice and a training token) with an unknown (NaN) engine log-prob; llama.cpp's grammar ends
with its own end-of-text token, which is recorded as the trainer's end-of-sequence token the same way.

The sampling stream: each request without its own seed gets the next seed of a counter-based stream started
from the run's seed (`seed_sampling`), saved in checkpoints (`sampling_state`) so a resumed run continues it.
Which request draws which seed depends on arrival order, so concurrent rollouts reproduce in distribution only
(as on the transformers path).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from agentflow.clock import waiting_for_capacity
from agentflow.config import LlamaCppEngineConfig
from agentflow.engines.base import Completion, Engine, Message, SamplingParams
from agentflow.engines.constrained import COMPACT_JSON
from agentflow.engines.hf import BASE_ADAPTER, TransformersEngine, _cut_at_stop, _stop_string_end
from agentflow.engines.llamacpp import NEUTRAL_SAMPLER, LlamaCppEngine, cached_tokens, parse_completion_error
from agentflow.errors import EngineContextOverflowError, EngineResponseError, EngineUnavailableError
from agentflow.train.policy import is_planner_call

log = logging.getLogger(__name__)


_UNKNOWN_WEIGHTS = "<unknown>"
"""A slot's weights after a request that did not finish: its cache is never reused."""


class StalePolicyError(EngineUnavailableError):
    """The engine's last sync failed: it holds older weights than the trainer, and refuses to sample."""

    kind = "stale_policy"
    retryable = False


def llguidance_grammar(schema: dict[str, Any]) -> str:
    """llama.cpp's grammar string for `schema`, in the layout of `constrained.COMPACT_JSON`."""
    return "%llguidance {}\nstart: %json " + json.dumps({**schema, "x-guidance": COMPACT_JSON})


class PolicyRollout:
    """What every rollout engine of the trainable policy shares: the trainer's tokenizer for the prompt ids, the
    weights version it holds and its refusal to sample from any other, the seed stream, and the reply's
    token ids and raw log-probs turned into a Completion."""

    model_name: str

    def _init_policy(self, trainer_engine: TransformersEngine) -> None:
        self.trainer_engine = trainer_engine
        self.supports_json_schema = trainer_engine.supports_json_schema
        self.weights_version: int | None = None
        """The trainer's weights version the engine samples from (None: not synced yet)."""
        self.stale: str | None = None
        self._inflight = 0
        self._seed_base = 0
        self._seed_counter = 0
        self._tokenizer = trainer_engine.tokenizer
        self._eos_ids = trainer_engine._eos_ids()
        self._special_ids = set(self._tokenizer.all_special_ids)

    def _failed_sync(self, version: int, err: Exception) -> None:
        self.stale = f"the sync of weights version {version} failed: {type(err).__name__}: {err}"

    def _synced(self, version: int) -> None:
        self.stale = None
        self.weights_version = version

    def _check_synced(self) -> None:
        if self.stale is not None:
            raise StalePolicyError(f"the policy engine refuses to sample: {self.stale}")
        if self.weights_version is None:
            raise StalePolicyError("the policy engine was never synced with the trainer's weights")

    def _check_idle(self) -> None:
        if self._inflight:
            raise RuntimeError(f"sync with {self._inflight} requests in flight: rollouts must not overlap a sync")

    # -- the sampling stream -------------------------------------------------------------------------------

    def seed_sampling(self, seed: int) -> None:
        self._seed_base, self._seed_counter = seed, 0

    def sampling_state(self) -> dict[str, torch.Tensor]:
        return {"engine_seed_stream": torch.tensor([self._seed_base, self._seed_counter], dtype=torch.int64)}

    def load_sampling_state(self, state: dict[str, torch.Tensor]) -> None:
        if "engine_seed_stream" not in state:
            raise ValueError("the checkpoint's sampling stream is the transformers engine's, not a rollout "
                             "engine's: resume with the rollout_engine the run was started with")
        self._seed_base, self._seed_counter = (int(v) for v in state["engine_seed_stream"].tolist())

    def _seed(self, sampling: SamplingParams) -> int:
        if sampling.seed is not None:
            return sampling.seed
        digest = hashlib.sha256(f"{self._seed_base}/{self._seed_counter}".encode()).digest()
        self._seed_counter += 1
        return int.from_bytes(digest[:4], "little")

    # -- prompts and replies -------------------------------------------------------------------------------

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        text = self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def _reply(self, messages: list[Message], prompt: list[int], ids: list[int], logprobs: list[float],
               finish: str, sampling: SamplingParams, seconds: float, cached: int | None = None) -> Completion:
        """The Completion of a reply given as sampled ids and their raw log-probs; `finish` 'length' or 'stop'."""
        end = _stop_string_end(self._tokenizer, ids, sampling.stop, set(self._eos_ids)) if sampling.stop else None
        if end is not None:
            ids, logprobs = ids[:end], logprobs[:end]
        elif finish == "stop" and (not ids or ids[-1] not in self._eos_ids):
            # the engine stopped at an end-of-generation token, returned or not: llama.cpp's grammar ends with
            # <|endoftext|> where the chat template (and the trainer's masks) end with <|im_end|>; either ends
            # the reply, and the row records the trainer's, with an unknown engine log-prob
            if ids and ids[-1] in self._special_ids:
                ids, logprobs = ids[:-1], logprobs[:-1]
            ids, logprobs = ids + [self._eos_ids[0]], logprobs + [math.nan]
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        if end is not None:
            text = _cut_at_stop(text, sampling.stop)
        prefix = getattr(self.trainer_engine, "prefix", None)
        if prefix and is_planner_call(messages):
            text = prefix + text
        return Completion(text=text, finish_reason=finish, model=self.model_name, prompt_tokens=len(prompt),
                          cached_prompt_tokens=cached, completion_tokens=len(ids), seconds=seconds,
                          prompt_token_ids=prompt, token_ids=ids, logprobs=logprobs)


class LlamaCppPolicyEngine(PolicyRollout, LlamaCppEngine):
    """The policy's rollout engine: llama.cpp over an F16 base with the trainer's current LoRA adapters.

    `trainer_engine` is the trainer's TransformersEngine (its tokenizer builds every prompt; a planner prefix,
    if any, is applied the same way). `work_dir` holds the adapter files of the current weights. `adapters`
    names the PEFT adapters to serve: the planner's alone (`default`, applied to every request), or one per
    trained role, all loaded at once and chosen per request (`generate(adapter=...)`: llama.cpp's per-request
    LoRA scales, 1 for the role's adapter and 0 for the others; `BASE_ADAPTER` sets them all to 0, the frozen
    base). llama.cpp decodes requests together only when their adapters agree.

    The prompt cache with several weights: llama.cpp reuses a slot's cached prompt whatever adapter computed it
    (measured: the base's log-probs 0.037 nats off with it, 0.003 without). So where requests name their
    adapter, each goes to a slot chosen here (`id_slot`): a free slot that last decoded with the same weights
    (the one sharing the longest prompt prefix), whose cache is then reused; failing that, another free slot,
    whose prompt is read afresh (`cache_prompt: false`). llama.cpp's host-memory prompt cache, which would
    restore a state across slots without knowing its adapter, is off for such an engine.
    """

    def __init__(self, config: LlamaCppEngineConfig, *, trainer_engine: TransformersEngine, work_dir: Path,
                 adapters: list[str] | None = None, base_requests: bool = False) -> None:
        super().__init__(config)
        self._init_policy(trainer_engine)
        self.work_dir = work_dir
        self._n_ctx_slot = config.n_ctx // config.n_parallel
        self.adapters = list(adapters or ["default"])
        self._base_requests = base_requests
        self.adapter_paths: dict[str, Path] = {}
        """Each served adapter's current llama.cpp LoRA file (filled by `sync`)."""
        self._free_slots = set(range(config.n_parallel))
        self._forget_slots()

    def _forget_slots(self) -> None:
        """No slot holds a cached prompt (a fresh server)."""
        self._slot_weights: list[str | None] = [None] * self.config.n_parallel
        self._slot_prompts: list[list[int]] = [[] for _ in range(self.config.n_parallel)]

    def reload(self) -> None:
        super().reload()
        self._forget_slots()

    def _tune_params(self, params: Any) -> None:
        if self.per_request:
            params.cache_ram_mib = 0

    def take_slot(self, weights: str, prompt: list[int]) -> tuple[int, bool]:
        """A free slot for a request decoded with `weights` (an adapter's name or `BASE_ADAPTER`), and whether
        its cached prompt may be reused; the caller gives it back with `release_slot`."""
        def shared(slot: int) -> int:
            cached, n = self._slot_prompts[slot], 0
            for a, b in zip(cached, prompt, strict=False):
                if a != b:
                    break
                n += 1
            return n

        same = [slot for slot in sorted(self._free_slots) if self._slot_weights[slot] in (weights, None)]
        slot = max(same, key=shared) if same else min(self._free_slots)
        reuse = self._slot_weights[slot] in (weights, None)
        self._free_slots.discard(slot)
        self._slot_weights[slot], self._slot_prompts[slot] = weights, prompt
        return slot, reuse

    def release_slot(self, slot: int, *, done: bool) -> None:
        """Give `slot` back; a request that did not finish leaves its cache unknown (never reused)."""
        if not done:
            self._slot_weights[slot], self._slot_prompts[slot] = _UNKNOWN_WEIGHTS, []
        self._free_slots.add(slot)

    @property
    def per_request(self) -> bool:
        """Several adapters, a non-planner one, or frozen roles served by the base (`base_requests`): each
        request names its adapter."""
        return self.adapters != ["default"] or self._base_requests

    def lora_files(self) -> list[tuple[Path, float]]:
        # per-request adapters start at scale 0: a request that names none decodes with the base
        return [(self.adapter_paths[name], 0.0 if self.per_request else 1.0) for name in self.adapters
                if name in self.adapter_paths]

    def sync(self, model: torch.nn.Module, version: int) -> dict[str, float]:
        """Load the adapters of `model` (the trainer's weights `version`) into llama.cpp; returns seconds and
        bytes. On failure the engine is marked stale (every generate raises StalePolicyError) and the error
        is raised."""
        from agentflow.train.export import write_lora_gguf

        self._check_idle()
        started = time.perf_counter()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        targets = {name: self.work_dir / (f"adapter-{version:06d}.gguf" if name == "default" else
                                          f"adapter-{name}-{version:06d}.gguf") for name in self.adapters}
        size = 0
        previous = dict(self.adapter_paths)
        try:
            for name, target in targets.items():
                staging = target.with_suffix(".gguf.partial")
                try:
                    size += write_lora_gguf(model, template=self.model_path, out=staging, adapter=name)
                    os.replace(staging, target)
                finally:
                    staging.unlink(missing_ok=True)
            written = time.perf_counter() - started
            self.adapter_paths = targets
            self.reload()
        except Exception as err:
            self._failed_sync(version, err)
            raise
        for name, path in previous.items():
            if path != targets.get(name):
                path.unlink(missing_ok=True)
        self._synced(version)
        seconds = time.perf_counter() - started
        log.debug("synced weights version %d to llama.cpp in %.2fs (%d bytes)", version, seconds, size)
        return {"sync/seconds": seconds, "sync/write_seconds": written, "sync/load_seconds": seconds - written,
                "sync/bytes": float(size)}

    def completion_body(self, prompt: list[int], sampling: SamplingParams,
                        json_schema: dict[str, Any] | None, adapter: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": prompt, "n_predict": sampling.max_tokens, "temperature": sampling.temperature,
            "top_p": sampling.top_p, **NEUTRAL_SAMPLER, "n_probs": 1, "post_sampling_probs": False,
            "cache_prompt": True, "seed": self._seed(sampling),
        }
        if json_schema is not None:
            body["grammar"] = llguidance_grammar(json_schema)
        if self.per_request:
            body["lora"] = self.lora_scales(adapter)
        elif adapter not in (None, "default"):
            raise ValueError(f"this engine serves the planner's adapter only, not {adapter!r}")
        return body

    def lora_scales(self, adapter: str | None) -> list[dict[str, Any]]:
        """llama.cpp's per-request LoRA list: scale 1 for `adapter`, 0 for every other (all 0: the base)."""
        if adapter is None:
            raise ValueError(f"this engine serves the adapters {self.adapters}: each request must name one "
                             f"(or {BASE_ADAPTER!r}, the base)")
        if adapter != BASE_ADAPTER and adapter not in self.adapters:
            raise ValueError(f"unknown adapter {adapter!r}; this engine serves {self.adapters}")
        return [{"id": i, "scale": 1.0 if name == adapter else 0.0} for i, name in enumerate(self.adapters)]

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        self.load()
        return self._server.handle_completions(body)

    async def generate(self, messages: list[Message], sampling: SamplingParams, *,
                       json_schema: dict[str, Any] | None = None, adapter: str | None = None) -> Completion:
        self._check_synced()
        schema = json_schema if self.supports_json_schema else None
        prompt = self.prompt_ids(messages)
        if len(prompt) + sampling.max_tokens > self._n_ctx_slot:
            raise EngineContextOverflowError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({sampling.max_tokens}) exceeds a llama.cpp slot's "
                f"context ({self._n_ctx_slot} = n_ctx / n_parallel)")
        body = self.completion_body(prompt, sampling, schema, adapter)
        slots = self._capacity()
        with waiting_for_capacity():
            await slots.acquire()
        slot, done = None, False
        if self.per_request:  # several weights: a slot whose cache they computed (class docstring)
            assert adapter is not None  # lora_scales refused None
            slot, body["cache_prompt"] = self.take_slot(adapter, prompt)
            body["id_slot"] = slot
        self._inflight += 1
        started = time.perf_counter()
        try:
            with self._compute.served():  # the slots decode together on the same threads
                response = await asyncio.get_running_loop().run_in_executor(self._executor, self._complete, body)
            done = True
        finally:
            self._inflight -= 1
            if slot is not None:
                self.release_slot(slot, done=done)
            slots.release()
        parse_completion_error(response)
        try:
            choice = response["choices"][0]
            entries = (choice.get("logprobs") or {}).get("content") or []
            ids = [int(e["id"]) for e in entries]
            logprobs = [float(e["logprob"]) for e in entries]
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise EngineResponseError(f"llama.cpp completion without token ids / log-probs: {err}") from err
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return self._reply(messages, prompt, ids, logprobs, finish, sampling, time.perf_counter() - started,
                           cached_tokens(response))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "engine": "llamacpp-policy",
                "adapters": {name: str(path) for name, path in self.adapter_paths.items()},
                "weights_version": self.weights_version,
                "logprobs": "raw model log-probs (temperature 1, no grammar mask) of the sampled tokens; the "
                            "trainer corrects the gap (truncated importance sampling)"}


class VLLMPolicyEngine(PolicyRollout, Engine):
    """The policy's rollout engine on a vLLM server (a GPU) that loads LoRA adapters at runtime.

    Built against vLLM's documented OpenAI-compatible API (not run here: vLLM needs a GPU and a registry):

    - the server runs the policy's base with LoRA enabled and runtime loading allowed:
      `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE --enable-lora --max-lora-rank R`, its
      structured outputs on the guidance (llguidance) backend, so that `x-guidance` sets the JSON layout the
      trainer's masks replay;
    - `sync` saves each served adapter in PEFT's format under `adapter_dir` (a folder the server can read),
      loads it with `POST /v1/load_lora_adapter {lora_name, lora_path}` under a name per adapter and weights
      version, and unloads the previous ones (`/v1/unload_lora_adapter`); `max_loras` on the server must
      allow one per trained role;
    - `generate` sends the prompt as token ids to `POST /v1/completions` with the current adapter's name as
      the model (with several adapters, the request's `adapter=`; `BASE_ADAPTER`: the base model, the
      entry of `GET /v1/models` that has no parent), `logprobs: 1` and `return_tokens_as_token_ids`, and
      reads back the sampled ids
      (`token_id:N`) and their log-probs, which vLLM reports raw (before temperature and processors, its
      default `logprobs_mode`), the same quantity llama.cpp reports and the trainer's gap compares.
    """

    def __init__(self, *, base_url: str, trainer_engine: TransformersEngine, adapter_dir: Path,
                 api_key: str | None = None, timeout_s: float = 600.0, max_concurrency: int = 64,
                 adapters: list[str] | None = None) -> None:
        import httpx

        self._init_policy(trainer_engine)
        self.base_url = base_url.rstrip("/")
        self.adapter_dir = adapter_dir
        self.model_name = "agentflow-policy"
        self.adapters = list(adapters or ["default"])
        self.served: dict[str, str] = {}
        """Each adapter's name on the server at the current weights version (filled by `sync`)."""
        self.base_model: str | None = None
        """The server's base model name (for `BASE_ADAPTER` requests; read from /v1/models on first use)."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._headers = headers
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)
        self._client: Any = None
        self._gate = asyncio.Semaphore(max_concurrency)

    def _post(self, path: str, body: dict[str, Any]) -> None:
        import httpx

        response = httpx.post(f"{self.base_url}{path}", json=body, headers=self._headers, timeout=self._timeout)
        if response.status_code >= 400:
            raise EngineUnavailableError(f"vLLM {path} answered {response.status_code}: {response.text[:500]}")

    def served_name(self, adapter: str, version: int) -> str:
        return f"agentflow-{'policy' if adapter == 'default' else adapter}-v{version}"

    def sync(self, model: torch.nn.Module, version: int) -> dict[str, float]:
        """Save the adapters of `model` and load them into vLLM under new names; unload the previous ones."""
        import httpx

        from agentflow.train.export import save_one_adapter

        self._check_idle()
        started = time.perf_counter()
        names = {adapter: self.served_name(adapter, version) for adapter in self.adapters}
        size, load_seconds = 0, 0.0
        try:
            for adapter, name in names.items():
                folder = self.adapter_dir / name
                save_one_adapter(model, adapter, folder)
                size += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
                loading = time.perf_counter()
                self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(folder.resolve())})
                load_seconds += time.perf_counter() - loading
        except (httpx.HTTPError, EngineUnavailableError, OSError, ValueError) as err:
            self._failed_sync(version, err)
            raise
        previous, self.served = self.served, names
        self._synced(version)
        for name in set(previous.values()) - set(names.values()):
            try:
                self._post("/unload_lora_adapter", {"lora_name": name})
            except (httpx.HTTPError, EngineUnavailableError) as err:  # a leftover adapter costs memory, not truth
                log.warning("vLLM kept the previous adapter %s: %s", name, err)
        seconds = time.perf_counter() - started
        return {"sync/seconds": seconds, "sync/write_seconds": seconds - load_seconds,
                "sync/load_seconds": load_seconds, "sync/bytes": float(size)}

    def _model(self, adapter: str | None) -> str:
        """The `model` a request names: the adapter's served name, or the base model's."""
        if adapter is None and self.adapters == ["default"]:
            adapter = "default"
        if adapter == BASE_ADAPTER:
            assert self.base_model is not None, "generate reads the base model's name first"
            return self.base_model
        if adapter not in self.served:
            raise ValueError(f"this engine serves the adapters {self.adapters}: each request must name one "
                             f"(or {BASE_ADAPTER!r}, the base), got {adapter!r}")
        return self.served[adapter]

    def _read_base_model(self) -> str:
        import httpx

        try:
            response = httpx.get(f"{self.base_url}/models", headers=self._headers, timeout=self._timeout)
            response.raise_for_status()
            cards = response.json()["data"]
            return next(str(card["id"]) for card in cards if not card.get("parent"))
        except (httpx.HTTPError, KeyError, TypeError, ValueError, StopIteration) as err:
            raise EngineUnavailableError(f"vLLM at {self.base_url}: no base model in /models: "
                                         f"{type(err).__name__}: {err}") from err

    def completion_body(self, prompt: list[int], sampling: SamplingParams,
                        json_schema: dict[str, Any] | None, adapter: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model(adapter), "prompt": prompt, "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": -1, "min_p": 0.0,
            "repetition_penalty": 1.0, "seed": self._seed(sampling), "logprobs": 1,
            "return_tokens_as_token_ids": True, "skip_special_tokens": False,
        }
        if json_schema is not None:
            body["structured_outputs"] = {"json": {**json_schema, "x-guidance": COMPACT_JSON}}
        return body

    async def generate(self, messages: list[Message], sampling: SamplingParams, *,
                       json_schema: dict[str, Any] | None = None, adapter: str | None = None) -> Completion:
        import httpx

        self._check_synced()
        prompt = self.prompt_ids(messages)
        if adapter == BASE_ADAPTER and self.base_model is None:
            self.base_model = await asyncio.to_thread(self._read_base_model)
        body = self.completion_body(prompt, sampling, json_schema if self.supports_json_schema else None, adapter)
        if self._client is None:
            self._client = httpx.AsyncClient(headers=self._headers, timeout=self._timeout)
        started = time.perf_counter()
        self._inflight += 1
        try:
            async with self._gate:
                response = await self._client.post(f"{self.base_url}/completions", json=body)
        except httpx.HTTPError as err:
            raise EngineUnavailableError(f"vLLM at {self.base_url}: {type(err).__name__}: {err}") from err
        finally:
            self._inflight -= 1
        if response.status_code >= 400:
            from agentflow.engines.llamacpp import _error_for_status

            raise _error_for_status(response.status_code, f"vLLM answered {response.status_code}: "
                                                           f"{response.text[:500]}")
        try:
            answer = response.json()
            choice = answer["choices"][0]
            logprobs = choice["logprobs"]
            ids = [int(str(token).removeprefix("token_id:")) for token in logprobs["tokens"]]
            values = [float(v) for v in logprobs["token_logprobs"]]
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise EngineResponseError(f"vLLM completion without token ids / log-probs: {err}") from err
        if len(ids) != len(values):
            raise EngineResponseError(f"vLLM returned {len(ids)} tokens but {len(values)} log-probs")
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        cached = ((answer.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        return self._reply(messages, prompt, ids, values, finish, sampling, time.perf_counter() - started,
                           cached if isinstance(cached, int) else None)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def describe(self) -> dict[str, Any]:
        return {"engine": "vllm-policy", "base_url": self.base_url, "adapters": dict(self.served),
                "weights_version": self.weights_version,
                "logprobs": "raw model log-probs of the sampled tokens (vLLM's default logprobs_mode); the "
                            "trainer corrects the gap (truncated importance sampling)"}

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

from agentflow.config import LlamaCppEngineConfig
from agentflow.engines.base import Completion, Message, SamplingParams
from agentflow.engines.constrained import COMPACT_JSON
from agentflow.engines.hf import TransformersEngine, _stop_string_end
from agentflow.engines.llamacpp import NEUTRAL_SAMPLER, LlamaCppEngine, parse_completion_error
from agentflow.errors import EngineContextOverflowError, EngineResponseError, EngineUnavailableError
from agentflow.train.policy import is_planner_call

log = logging.getLogger(__name__)


class StalePolicyError(EngineUnavailableError):
    """The engine's last sync failed: it holds older weights than the trainer, and refuses to sample."""

    kind = "stale_policy"
    retryable = False


def llguidance_grammar(schema: dict[str, Any]) -> str:
    """llama.cpp's grammar string for `schema`, in the layout of `constrained.COMPACT_JSON`."""
    return "%llguidance {}\nstart: %json " + json.dumps({**schema, "x-guidance": COMPACT_JSON})


class LlamaCppPolicyEngine(LlamaCppEngine):
    """The policy's rollout engine: llama.cpp over an F16 base with the trainer's current LoRA adapter.

    `trainer_engine` is the trainer's TransformersEngine (its tokenizer builds every prompt; a planner prefix,
    if any, is applied the same way). `work_dir` holds the adapter file of the current weights.
    """

    def __init__(self, config: LlamaCppEngineConfig, *, trainer_engine: TransformersEngine, work_dir: Path) -> None:
        super().__init__(config)
        self.trainer_engine = trainer_engine
        self.supports_json_schema = trainer_engine.supports_json_schema
        self.work_dir = work_dir
        self.weights_version: int | None = None
        """The trainer's weights version the engine samples from (None: not synced yet)."""
        self.stale: str | None = None
        self._inflight = 0
        self._seed_base = 0
        self._seed_counter = 0
        tokenizer = trainer_engine.tokenizer
        self._tokenizer = tokenizer
        self._eos_ids = trainer_engine._eos_ids()
        self._special_ids = set(tokenizer.all_special_ids)
        self._n_ctx_slot = config.n_ctx // config.n_parallel

    # -- the adapter ---------------------------------------------------------------------------------------

    def sync(self, model: torch.nn.Module, version: int) -> dict[str, float]:
        """Load the adapter of `model` (the trainer's weights `version`) into llama.cpp; returns seconds and
        bytes. On failure the engine is marked stale (every generate raises StalePolicyError) and the error
        is raised."""
        from agentflow.train.export import write_lora_gguf

        if self._inflight:
            raise RuntimeError(f"sync with {self._inflight} requests in flight: rollouts must not overlap a sync")
        started = time.perf_counter()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        target = self.work_dir / f"adapter-{version:06d}.gguf"
        staging = target.with_suffix(".gguf.partial")
        try:
            size = write_lora_gguf(model, template=self.model_path, out=staging)
            os.replace(staging, target)
            written = time.perf_counter() - started
            previous, self.lora_path = self.lora_path, target
            self.reload()
        except Exception as err:
            staging.unlink(missing_ok=True)
            self.stale = f"the sync of weights version {version} failed: {type(err).__name__}: {err}"
            raise
        if previous is not None and previous != target:
            previous.unlink(missing_ok=True)
        self.stale = None
        self.weights_version = version
        seconds = time.perf_counter() - started
        log.debug("synced weights version %d to llama.cpp in %.2fs (%d bytes)", version, seconds, size)
        return {"sync/seconds": seconds, "sync/write_seconds": written, "sync/load_seconds": seconds - written,
                "sync/bytes": float(size)}

    # -- the sampling stream -------------------------------------------------------------------------------

    def seed_sampling(self, seed: int) -> None:
        self._seed_base, self._seed_counter = seed, 0

    def sampling_state(self) -> dict[str, torch.Tensor]:
        return {"llamacpp_seed_stream": torch.tensor([self._seed_base, self._seed_counter], dtype=torch.int64)}

    def load_sampling_state(self, state: dict[str, torch.Tensor]) -> None:
        if "llamacpp_seed_stream" not in state:
            raise ValueError("the checkpoint's sampling stream is the transformers engine's, not llama.cpp's")
        self._seed_base, self._seed_counter = (int(v) for v in state["llamacpp_seed_stream"].tolist())

    def _next_seed(self) -> int:
        digest = hashlib.sha256(f"{self._seed_base}/{self._seed_counter}".encode()).digest()
        self._seed_counter += 1
        return int.from_bytes(digest[:4], "little")

    # -- generation ----------------------------------------------------------------------------------------

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        text = self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def completion_body(self, prompt: list[int], sampling: SamplingParams,
                        json_schema: dict[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": prompt, "n_predict": sampling.max_tokens, "temperature": sampling.temperature,
            "top_p": sampling.top_p, **NEUTRAL_SAMPLER, "n_probs": 1, "post_sampling_probs": False,
            "cache_prompt": True, "seed": sampling.seed if sampling.seed is not None else self._next_seed(),
        }
        if json_schema is not None:
            body["grammar"] = llguidance_grammar(json_schema)
        return body

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        self.load()
        return self._server.handle_completions(body)

    async def generate(self, messages: list[Message], sampling: SamplingParams, *,
                       json_schema: dict[str, Any] | None = None) -> Completion:
        if self.stale is not None:
            raise StalePolicyError(f"the policy engine refuses to sample: {self.stale}")
        if self.weights_version is None:
            raise StalePolicyError("the policy engine was never synced with the trainer's weights")
        schema = json_schema if self.supports_json_schema else None
        prompt = self.prompt_ids(messages)
        if len(prompt) + sampling.max_tokens > self._n_ctx_slot:
            raise EngineContextOverflowError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({sampling.max_tokens}) exceeds a llama.cpp slot's "
                f"context ({self._n_ctx_slot} = n_ctx / n_parallel)")
        body = self.completion_body(prompt, sampling, schema)
        slots = self._capacity()
        from agentflow.clock import waiting_for_capacity

        with waiting_for_capacity():
            await slots.acquire()
        self._inflight += 1
        started = time.perf_counter()
        try:
            response = await asyncio.get_running_loop().run_in_executor(self._executor, self._complete, body)
        finally:
            self._inflight -= 1
            slots.release()
        completion = self._completion(response, prompt, sampling, time.perf_counter() - started)
        prefix = getattr(self.trainer_engine, "prefix", None)
        if prefix and is_planner_call(messages):
            completion = completion.model_copy(update={"text": prefix + completion.text})
        return completion

    def _completion(self, response: Any, prompt: list[int], sampling: SamplingParams, seconds: float) -> Completion:
        parse_completion_error(response)
        try:
            choice = response["choices"][0]
            entries = (choice.get("logprobs") or {}).get("content") or []
            ids = [int(e["id"]) for e in entries]
            logprobs = [float(e["logprob"]) for e in entries]
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise EngineResponseError(f"llama.cpp completion without token ids / log-probs: {err}") from err
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        end = _stop_string_end(self._tokenizer, ids, sampling.stop, set(self._eos_ids)) if sampling.stop else None
        if end is not None:
            ids, logprobs = ids[:end], logprobs[:end]
        elif finish == "stop" and (not ids or ids[-1] not in self._eos_ids):
            # llama.cpp stopped at an end-of-generation token: its grammar ends with <|endoftext|> where the
            # chat template (and the trainer's masks) end with <|im_end|>; either ends the reply, and the row
            # records the trainer's, with an unknown engine log-prob
            if ids and ids[-1] in self._special_ids:
                ids, logprobs = ids[:-1], logprobs[:-1]
            ids, logprobs = ids + [self._eos_ids[0]], logprobs + [math.nan]
        text = self._tokenizer.decode(ids, skip_special_tokens=True)
        if end is not None:
            from agentflow.engines.hf import _cut_at_stop

            text = _cut_at_stop(text, sampling.stop)
        return Completion(text=text, finish_reason=finish, model=self.model_name, prompt_tokens=len(prompt),
                          completion_tokens=len(ids), seconds=seconds, prompt_token_ids=prompt, token_ids=ids,
                          logprobs=logprobs)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "engine": "llamacpp-policy", "adapter": str(self.lora_path),
                "weights_version": self.weights_version,
                "logprobs": "raw model log-probs (temperature 1, no grammar mask) of the sampled tokens; the "
                            "trainer corrects the gap (truncated importance sampling)"}

"""The planner's engine on verl: token-in/token-out calls to verl's rollout servers (vLLM or SGLang).

The chat template is applied once, here, to get the prompt ids; the server returns the sampled token ids
and their log-probs, which go into the `Completion` unchanged. The decoded text is only for the flow to
read: the training row is built from the ids, never from re-tokenised text.

One engine object serves every trajectory of an agent-loop worker. Which server handle, request id and
verl sampling settings a call uses comes from `ROLLOUT`, a context variable each trajectory sets for
itself (asyncio tasks copy the context, so concurrent trajectories never see each other's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentflow.engines.base import Completion, Engine, Message, SamplingParams
from agentflow.errors import (
    ConfigError,
    EngineBadRequestError,
    EngineResponseError,
    EngineServerError,
)

log = logging.getLogger(__name__)


class TokenServer(Protocol):
    """What we use of verl's `LLMServerClient`: `generate` returns a `TokenOutput` (token_ids, log_probs,
    stop_reason, extra_fields)."""

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any: ...


@dataclass
class RolloutContext:
    """The verl side of one trajectory: its server handle, request id and verl's sampling settings."""

    server: TokenServer
    request_id: str
    verl_sampling: dict[str, Any] = field(default_factory=dict)
    min_global_steps: int | None = None
    max_global_steps: int | None = None
    preempted: int = 0

    def note_versions(self, extra: dict[str, Any]) -> None:
        """Track which policy versions generated this trajectory (verl's staleness bookkeeping)."""
        low, high = extra.get("min_global_steps"), extra.get("max_global_steps")
        if low is not None:
            self.min_global_steps = low if self.min_global_steps is None else min(self.min_global_steps, low)
        if high is not None:
            self.max_global_steps = high if self.max_global_steps is None else max(self.max_global_steps, high)


ROLLOUT: ContextVar[RolloutContext] = ContextVar("agentflow_verl_rollout")


class RolloutServerEngine(Engine):
    """`Engine` over verl's rollout servers. Never retries: a failed call is an infrastructure failure, and
    the flow records it so the trajectory is excluded from training rather than scored 0."""

    supports_json_schema = False
    """The tolerant planner parser is used: guided decoding would sample from a distribution the trainer's
    log-probs do not describe."""

    def __init__(self, *, tokenize: Callable[[list[Message]], list[int]], decode: Callable[[list[int]], str],
                 model_name: str, response_length: int) -> None:
        self._tokenize = tokenize
        self._decode = decode
        self.model_name = model_name
        self.response_length = response_length

    def describe(self) -> dict[str, Any]:
        return {"engine": "verl_rollout_server", "model": self.model_name}

    def request(self, sampling: SamplingParams, verl_sampling: dict[str, Any]) -> dict[str, Any]:
        """The sampling dict sent to the server: verl's knobs (top_k, repetition penalty) with ours on top,
        so what the trajectory records is what was sampled."""
        params = {k: v for k, v in verl_sampling.items() if k not in ("max_tokens", "max_new_tokens")}
        params.update(temperature=sampling.temperature, top_p=sampling.top_p, logprobs=True,
                      max_tokens=min(sampling.max_tokens, self.response_length))
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        return params

    async def generate(self, messages: list[Message], sampling: SamplingParams, *,
                       json_schema: dict[str, Any] | None = None) -> Completion:
        context = ROLLOUT.get(None)
        if context is None:
            raise ConfigError("RolloutServerEngine called outside a verl rollout (no server bound)")
        loop = asyncio.get_running_loop()
        prompt_ids = list(await loop.run_in_executor(None, self._tokenize, messages))
        params = self.request(sampling, context.verl_sampling)
        start = loop.time()
        try:
            output = await context.server.generate(request_id=context.request_id, prompt_ids=prompt_ids,
                                                   sampling_params=params)
        except asyncio.CancelledError:
            raise
        except ValueError as err:  # verl's servers raise ValueError for prompts beyond the model's context
            raise EngineBadRequestError(f"rollout server refused the request: {err}") from err
        except Exception as err:  # Ray actor errors, server crashes: nothing the policy did
            raise EngineServerError(f"rollout server failed: {type(err).__name__}: {err}") from err
        token_ids = list(output.token_ids or [])
        logprobs = output.log_probs
        if output.stop_reason in ("aborted", "abort"):  # vLLM's and SGLang's words
            raise EngineServerError("rollout server aborted the request")
        if logprobs is None:
            raise EngineResponseError("rollout server returned no log-probs (rollout.calculate_log_probs must "
                                      "be true)")
        if len(logprobs) != len(token_ids):
            raise EngineResponseError(f"rollout server returned {len(token_ids)} tokens but {len(logprobs)} "
                                      "log-probs")
        context.note_versions(dict(getattr(output, "extra_fields", None) or {}))
        context.preempted += int(getattr(output, "num_preempted", None) or 0)
        text = await loop.run_in_executor(None, self._decode, token_ids)
        return Completion(
            text=text,
            finish_reason="length" if len(token_ids) >= params["max_tokens"] else "stop",
            model=self.model_name,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(token_ids),
            seconds=loop.time() - start,
            prompt_token_ids=prompt_ids,
            token_ids=token_ids,
            logprobs=[float(x) for x in logprobs],
        )

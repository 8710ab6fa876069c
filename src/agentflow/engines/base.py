"""The engine contract: async `generate(messages, sampling) -> Completion`, shared by every backend."""

from __future__ import annotations

import abc
import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentflow.errors import EngineError
from agentflow.textsafe import clean_text

log = logging.getLogger(__name__)

Message = dict[str, str]
"""A chat message: {"role": "system" | "user" | "assistant", "content": str}."""


class SamplingParams(BaseModel):
    """Sampling settings of one role. Exactly these are sent to the engine and recorded in the trajectory."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature; 0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: int = Field(256, ge=1, description="Upper bound on generated tokens for one call.")
    seed: int | None = Field(None, description="Sampling seed, where the engine supports one.")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")


class Completion(BaseModel):
    """One engine reply. `text` is always a string; failures are exceptions, never a Completion."""

    text: str
    finish_reason: str | None = None
    model: str = ""
    prompt_tokens: int = 0
    cached_prompt_tokens: int | None = Field(None, description="Prompt tokens the engine took from its prompt "
                                             "cache instead of reading them (None: the engine does not say).")
    completion_tokens: int = 0
    seconds: float = 0.0
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = Field(None, description="Log-prob of each sampled token under the sampler.")

    @field_validator("text")
    @classmethod
    def _clean(cls, text: str) -> str:  # half an emoji cut off by max_tokens must not make the record unwritable
        return clean_text(text)


class Engine(abc.ABC):
    """A language-model backend. Implementations must be safe to call concurrently from one event loop."""

    #: True when `generate(..., json_schema=...)` constrains decoding to the schema.
    supports_json_schema: bool = False
    #: Model name recorded in trajectories.
    model_name: str = ""

    @abc.abstractmethod
    async def generate(
        self,
        messages: list[Message],
        sampling: SamplingParams,
        *,
        json_schema: dict[str, Any] | None = None,
    ) -> Completion:
        """Generate one reply. Raises a subclass of EngineError on failure."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most engines hold nothing
        """Release resources (HTTP clients, model memory)."""

    def describe(self) -> dict[str, Any]:
        """Engine settings recorded in trajectories."""
        return {"engine": type(self).__name__, "model": self.model_name}


T = TypeVar("T")


async def with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    max_retries: int,
    base_delay_s: float = 0.5,
    max_delay_s: float = 8.0,
) -> T:
    """Run `call`, retrying retryable EngineErrors with exponential backoff and jitter."""
    attempt = 0
    while True:
        try:
            return await call()
        except EngineError as err:
            if not err.retryable or attempt >= max_retries:
                raise
            delay = min(max_delay_s, base_delay_s * 2**attempt) * (0.5 + random.random() / 2)
            log.warning("engine call failed (%s: %s); retry %d/%d in %.2fs",
                        err.kind, err, attempt + 1, max_retries, delay)
            attempt += 1
            await asyncio.sleep(delay)

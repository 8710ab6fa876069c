"""A scripted engine for unit tests of control flow: replies come from a list or a function."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from agentflow.engines.base import Completion, Engine, Message, SamplingParams
from agentflow.errors import EngineError

Reply = str | EngineError | Callable[[list[Message]], "str | EngineError"]


class ScriptedEngine(Engine):
    """Returns scripted replies in order (cycling the last one), or raises scripted errors.

    Every call is recorded in `calls` as (messages, sampling, json_schema).
    """

    supports_json_schema = True

    def __init__(self, replies: Sequence[Reply] | Callable[[list[Message]], str], *, delay_s: float = 0.0,
                 model_name: str = "scripted") -> None:
        self._replies = replies
        self._index = 0
        self.delay_s = delay_s
        self.model_name = model_name
        self.calls: list[tuple[list[Message], SamplingParams, dict[str, Any] | None]] = []

    async def generate(self, messages: list[Message], sampling: SamplingParams, *,
                       json_schema: dict[str, Any] | None = None) -> Completion:
        self.calls.append((messages, sampling, json_schema))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if callable(self._replies):
            reply: Reply = self._replies(messages)
        else:
            reply = self._replies[min(self._index, len(self._replies) - 1)]
            self._index += 1
        if callable(reply) and not isinstance(reply, EngineError):
            reply = reply(messages)
        if isinstance(reply, EngineError):
            raise reply
        words = len(reply.split())
        return Completion(text=reply, finish_reason="stop", model=self.model_name,
                          prompt_tokens=sum(len(m["content"].split()) for m in messages), completion_tokens=words)

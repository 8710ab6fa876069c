"""Fakes for the verl tests: a byte-level tokenizer and a rollout server that speaks verl's token protocol.

The server answers the planner with token ids (UTF-8 bytes of a scripted reply, then EOS) and a log-prob
per token, like verl's `LLMServerClient.generate` returning a `TokenOutput`. It records every request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

EOS = 256
ASSISTANT = 257
"""Special ids above the byte range: end of sequence, start of the assistant turn."""


class ByteTokenizer:
    """Chat template: each message as '<role>: content\\n' in UTF-8 bytes, then the ASSISTANT marker."""

    eos_token_id = EOS
    pad_token_id = 0

    def apply(self, messages: list[dict[str, str]]) -> list[int]:
        text = "".join(f"<{m['role']}>: {m['content']}\n" for m in messages)
        return list(text.encode()) + [ASSISTANT]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")


def logprob_of(position: int, token: int) -> float:
    """A deterministic, distinct log-prob per (position, token), so a test can tell rows apart."""
    return -((position + 1) * 0.01 + token * 1e-5)


@dataclass
class TokenOutput:
    """Shape of verl's `verl.workers.rollout.replica.TokenOutput`."""

    token_ids: list[int]
    log_probs: list[float] | None
    stop_reason: str | None = "completed"
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    sampling_params: dict[str, Any]


def plan(tool: str = "echo", sub_goal: str = "look it up") -> str:
    return json.dumps({"context": "c", "sub_goal": sub_goal, "tool_name": tool})


class FakeRolloutServer:
    """Replies with `reply(request)`: a string (tokenised to bytes + EOS), an exception, or a TokenOutput."""

    def __init__(self, reply: Callable[[Request], Any] | None = None, *, version: int = 3,
                 delay_s: float = 0.0) -> None:
        self.reply = reply or (lambda request: plan())
        self.version = version
        self.delay_s = delay_s
        self.requests: list[Request] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        request = Request(request_id, list(prompt_ids), dict(sampling_params))
        self.requests.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            reply = self.reply(request)
        finally:
            self.in_flight -= 1
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, TokenOutput):
            return reply
        ids = list(reply.encode()) + [EOS]
        ids = ids[: sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[logprob_of(i, t) for i, t in enumerate(ids)],
                           extra_fields={"global_steps": self.version, "min_global_steps": self.version,
                                         "max_global_steps": self.version})


def tiny_hf_tokenizer():
    """A real Hugging Face fast tokenizer built in memory (byte-level, ChatML template): no download.

    Lets verl's own chat-template path (its continuous-token builder) run in tests.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.add_special_tokens({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                  "additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tokenizer

"""Any OpenAI-compatible chat server (OpenAI, vLLM, SGLang, Ollama, llama.cpp's server, gateways).

Uses the official `openai` async client with its own retries switched off: retries are ours
(`with_retries`), so `max_retries` in the config is the one number that counts, and every failure surfaces
as a typed EngineError.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import openai

from agentflow.config import OpenAIEngineConfig
from agentflow.engines.base import Completion, Engine, Message, SamplingParams, with_retries
from agentflow.errors import (
    EngineError,
    EngineRateLimitError,
    EngineResponseError,
    EngineServerError,
    EngineTimeoutError,
    EngineUnavailableError,
    bad_request_error,
)

log = logging.getLogger(__name__)

#: Sent when no key is configured or the variable is unset: local servers (vLLM, llama.cpp) accept anything.
DUMMY_API_KEY = "not-needed"


class OpenAIEngine(Engine):
    """Chat completions over HTTP, with per-request timeout, typed errors and retry with backoff.

    The client is created per event loop (the HTTP connection pool belongs to one loop), so the engine also
    works when a caller runs several `asyncio.run(...)` in turn.
    """

    def __init__(self, config: OpenAIEngineConfig) -> None:
        self.config = config
        self.model_name = config.model
        self.supports_json_schema = config.json_schema
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, openai.AsyncOpenAI]] = {}

    def _api_key(self) -> str:
        if self.config.api_key_env and os.environ.get(self.config.api_key_env):
            return os.environ[self.config.api_key_env]
        return DUMMY_API_KEY

    def _client(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            for key in [k for k, (other, _) in self._clients.items() if other.is_closed()]:
                del self._clients[key]  # clients of finished loops cannot be closed any more; drop them
            client = openai.AsyncOpenAI(base_url=self.config.base_url, api_key=self._api_key(),
                                        timeout=self.config.timeout_s, max_retries=0)
            entry = self._clients[id(loop)] = (loop, client)
        return entry[1]

    def request_body(self, messages: list[Message], sampling: SamplingParams,
                     json_schema: dict[str, Any] | None = None) -> dict[str, Any]:
        """Keyword arguments of `chat.completions.create`: exactly the given settings, nothing implied."""
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = sampling.stop
        if json_schema is not None and self.config.json_schema:
            # strict=False: tool input schemas have optional fields, which OpenAI's strict mode refuses;
            # vLLM, SGLang and llama.cpp constrain decoding either way.
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "reply", "schema": json_schema, "strict": False}}
        if self.config.logprobs:
            body["logprobs"] = True
        if self.config.extra_body:
            body["extra_body"] = dict(self.config.extra_body)
        return body

    async def generate(self, messages: list[Message], sampling: SamplingParams, *,
                       json_schema: dict[str, Any] | None = None) -> Completion:
        body = self.request_body(messages, sampling, json_schema)
        return await with_retries(lambda: self._generate_once(body), max_retries=self.config.max_retries)

    async def _generate_once(self, body: dict[str, Any]) -> Completion:
        started = time.perf_counter()
        try:
            response = await self._client().chat.completions.create(**body, timeout=self.config.timeout_s)
        except openai.APIError as err:
            raise map_openai_error(err, base_url=self.config.base_url) from err
        except ValueError as err:  # the client parses the body itself: malformed JSON surfaces as ValueError
            raise EngineResponseError(f"{self.config.base_url}: reply is not valid JSON: {err}") from err
        return parse_completion(response, model=self.config.model, seconds=time.perf_counter() - started)

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        entry = self._clients.pop(id(loop), None)
        if entry is not None and entry[0] is loop:
            await entry[1].close()
        self._clients.clear()

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "openai",
            "model": self.config.model,
            "base_url": self.config.base_url,
            "json_schema": self.config.json_schema,
            "logprobs": self.config.logprobs,
            "timeout_s": self.config.timeout_s,
            "max_retries": self.config.max_retries,
            "extra_body": dict(self.config.extra_body),
        }


def map_openai_error(err: openai.APIError, *, base_url: str) -> EngineError:
    """The typed EngineError for an `openai` client exception."""
    if isinstance(err, openai.APITimeoutError):  # a subclass of APIConnectionError: test it first
        return EngineTimeoutError(f"{base_url}: request timed out")
    if isinstance(err, openai.APIConnectionError):
        return EngineUnavailableError(f"{base_url}: cannot connect ({err.__cause__ or err})")
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        message = f"{base_url}: HTTP {status}: {_error_message(err)}"
        if status == 429:
            return EngineRateLimitError(message)
        if status >= 500:
            return EngineServerError(message)
        inner = err.body.get("error") if isinstance(err.body, dict) else None
        code = inner.get("code") if isinstance(inner, dict) else None
        return bad_request_error(f"{message} ({code})" if isinstance(code, str) else message)
    # APIResponseValidationError and friends: the server answered something that is not a chat completion.
    return EngineResponseError(f"{base_url}: unusable reply: {err}")


def _error_message(err: openai.APIStatusError) -> str:
    body = err.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return err.message


def parse_completion(response: Any, *, model: str, seconds: float) -> Completion:
    """Turn the client's ChatCompletion into our Completion, or raise EngineResponseError."""
    if isinstance(response, str | bytes) or not hasattr(response, "choices"):
        # the client hands back the raw text when the body is not JSON
        raise EngineResponseError(f"reply is not a chat completion: {str(response)[:200]!r}")
    choices = response.choices
    if not choices:
        raise EngineResponseError("reply has no choices")
    choice = choices[0]
    message = getattr(choice, "message", None)
    text = getattr(message, "content", None)
    if not isinstance(text, str):
        raise EngineResponseError(f"reply has no text content (finish_reason={getattr(choice, 'finish_reason', None)})")
    token_ids, logprobs = _token_logprobs(choice)
    extra = response.model_extra or {}
    choice_extra = choice.model_extra or {}
    prompt_token_ids = choice_extra.get("prompt_token_ids") or extra.get("prompt_token_ids")
    if token_ids is None and isinstance(choice_extra.get("token_ids"), list):
        token_ids = [int(t) for t in choice_extra["token_ids"]]  # vLLM with return_token_ids
    usage = response.usage
    return Completion(
        text=text,
        finish_reason=choice.finish_reason,
        model=response.model or model,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        cached_prompt_tokens=getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        seconds=seconds,
        prompt_token_ids=[int(t) for t in prompt_token_ids] if isinstance(prompt_token_ids, list) else None,
        token_ids=token_ids,
        logprobs=logprobs,
    )


def _token_logprobs(choice: Any) -> tuple[list[int] | None, list[float] | None]:
    """Per-token log-probs, and token ids where the server names them.

    llama.cpp adds an `id` to each entry; vLLM with `return_tokens_as_token_ids` writes tokens as
    'token_id:123'. Other servers give only strings, so `token_ids` stays None.
    """
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    if not content:
        return None, None
    logprobs = [float(entry.logprob) for entry in content]
    ids: list[int] = []
    for entry in content:
        extra = entry.model_extra or {}
        if isinstance(extra.get("id"), int):
            ids.append(extra["id"])
        elif entry.token.startswith("token_id:") and entry.token[9:].isdigit():
            ids.append(int(entry.token[9:]))
        else:
            return None, logprobs
    return ids, logprobs

"""OpenAIEngine against real HTTP servers on 127.0.0.1: a scripted fake, and llama.cpp's own server."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentflow.config import OpenAIEngineConfig
from agentflow.engines.base import SamplingParams
from agentflow.engines.openai_http import DUMMY_API_KEY, OpenAIEngine
from agentflow.errors import (
    EngineBadRequestError,
    EngineContextOverflowError,
    EngineRateLimitError,
    EngineResponseError,
    EngineServerError,
    EngineTimeoutError,
    EngineUnavailableError,
)
from tests.servers import closed_port, echo, fake_openai_server, llamacpp_server, raw, reply, slow, status

MESSAGES = [{"role": "user", "content": "Say hi."}]


def make_engine(base_url: str, **settings: object) -> OpenAIEngine:
    config = {"model": "fake-model", "base_url": base_url, "api_key_env": "AGENTFLOW_TEST_KEY",
              "timeout_s": 5.0, "max_retries": 0, **settings}
    return OpenAIEngine(OpenAIEngineConfig.model_validate(config))


async def test_answers_and_sends_exactly_the_given_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTFLOW_TEST_KEY", "sk-test")
    with fake_openai_server(reply("hello there")) as server:
        engine = make_engine(server.base_url, extra_body={"top_k": 0})
        sampling = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=33, seed=5, stop=["\n\n"])
        completion = await engine.generate(MESSAGES, sampling)
        await engine.aclose()
    assert completion.text == "hello there"
    assert (completion.finish_reason, completion.prompt_tokens, completion.completion_tokens) == ("stop", 7, 2)
    sent = server.requests[0]
    assert {key: sent[key] for key in ("model", "messages", "temperature", "top_p", "max_tokens", "seed", "stop")} \
        == {"model": "fake-model", "messages": MESSAGES, "temperature": 0.7, "top_p": 0.9, "max_tokens": 33,
            "seed": 5, "stop": ["\n\n"]}
    assert sent["top_k"] == 0
    assert "response_format" not in sent and "logprobs" not in sent
    assert server.headers[0]["authorization"] == "Bearer sk-test"


async def test_missing_key_sends_a_dummy_for_local_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTFLOW_TEST_KEY", raising=False)
    with fake_openai_server(echo()) as server:
        engine = make_engine(server.base_url)
        assert (await engine.generate(MESSAGES, SamplingParams())).text == "Say hi."
        await engine.aclose()
    assert server.headers[0]["authorization"] == f"Bearer {DUMMY_API_KEY}"


async def test_json_schema_and_logprobs_are_requested_and_parsed() -> None:
    schema = {"type": "object", "properties": {"tool": {"type": "string"}}, "required": ["tool"]}
    with fake_openai_server(reply('{"tool": "python"}', token_ids=[11, 12, 2], logprobs=[-0.5, -0.25, 0.0])) \
            as server:
        engine = make_engine(server.base_url, logprobs=True)
        assert engine.supports_json_schema
        completion = await engine.generate(MESSAGES, SamplingParams(), json_schema=schema)
        await engine.aclose()
    sent = server.requests[0]
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"] == schema
    assert sent["logprobs"] is True
    assert completion.token_ids == [11, 12, 2]
    assert completion.logprobs == [-0.5, -0.25, 0.0]


async def test_logprobs_without_ids_keep_ids_none() -> None:
    with fake_openai_server(reply("a b", logprobs=[-1.0, -2.0])) as server:
        engine = make_engine(server.base_url, logprobs=True)
        completion = await engine.generate(MESSAGES, SamplingParams())
        await engine.aclose()
    assert completion.logprobs == [-1.0, -2.0]
    assert completion.token_ids is None


async def test_json_schema_off_in_config_sends_no_response_format() -> None:
    with fake_openai_server(reply("{}")) as server:
        engine = make_engine(server.base_url, json_schema=False)
        assert not engine.supports_json_schema
        await engine.generate(MESSAGES, SamplingParams(), json_schema={"type": "object"})
        await engine.aclose()
    assert "response_format" not in server.requests[0]


async def test_server_down_is_unavailable() -> None:
    engine = make_engine(f"http://127.0.0.1:{closed_port()}/v1")
    with pytest.raises(EngineUnavailableError, match="cannot connect"):
        await engine.generate(MESSAGES, SamplingParams())
    await engine.aclose()


async def test_slow_server_times_out() -> None:
    with fake_openai_server(slow(5.0, reply("late"))) as server:
        engine = make_engine(server.base_url, timeout_s=0.3)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(EngineTimeoutError):
            await engine.generate(MESSAGES, SamplingParams())
        assert loop.time() - started < 2.0
        await engine.aclose()


async def test_timeout_is_retried_then_succeeds() -> None:
    with fake_openai_server(slow(5.0, reply("late")), reply("on time")) as server:
        engine = make_engine(server.base_url, timeout_s=0.3, max_retries=1)
        assert (await engine.generate(MESSAGES, SamplingParams())).text == "on time"
        await engine.aclose()
    assert len(server.requests) == 2


async def test_429_then_200_is_retried() -> None:
    with fake_openai_server(status(429, "slow down"), reply("fine")) as server:
        engine = make_engine(server.base_url, max_retries=2)
        assert (await engine.generate(MESSAGES, SamplingParams())).text == "fine"
        await engine.aclose()
    assert len(server.requests) == 2


async def test_429_without_retries_is_rate_limit() -> None:
    with fake_openai_server(status(429, "slow down")) as server:
        engine = make_engine(server.base_url)
        with pytest.raises(EngineRateLimitError, match="slow down"):
            await engine.generate(MESSAGES, SamplingParams())
        await engine.aclose()
    assert len(server.requests) == 1, "the openai client must not retry on its own"


async def test_500_exhausts_retries_as_server_error() -> None:
    with fake_openai_server(status(500, "boom")) as server:
        engine = make_engine(server.base_url, max_retries=1)
        with pytest.raises(EngineServerError, match="HTTP 500: boom"):
            await engine.generate(MESSAGES, SamplingParams())
        await engine.aclose()
    assert len(server.requests) == 2


async def test_400_is_bad_request_and_not_retried() -> None:
    with fake_openai_server(status(400, "unknown field")) as server:
        engine = make_engine(server.base_url, max_retries=3)
        with pytest.raises(EngineBadRequestError, match="unknown field"):
            await engine.generate(MESSAGES, SamplingParams())
        await engine.aclose()
    assert len(server.requests) == 1


@pytest.mark.parametrize("message", [
    "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.",  # vLLM, OpenAI
    "Input is longer than the model's context length",  # SGLang
    "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it",  # llama.cpp
])
async def test_a_context_overflow_is_told_apart_from_other_bad_requests(message: str) -> None:
    with fake_openai_server(status(400, message)) as server:
        engine = make_engine(server.base_url, max_retries=3)
        with pytest.raises(EngineContextOverflowError):
            await engine.generate(MESSAGES, SamplingParams())
        await engine.aclose()
    assert len(server.requests) == 1


@pytest.mark.parametrize("body", [
    pytest.param(b'{"choices": [', id="malformed-json"),
    pytest.param(b"<html>gateway error</html>", id="not-json"),
    pytest.param(b'{"choices": []}', id="no-choices"),
    pytest.param(b'{"id": "x"}', id="missing-choices"),
    pytest.param(json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": None}}]}).encode(),
                 id="null-content"),
])
async def test_unusable_replies_are_response_errors(body: bytes) -> None:
    with fake_openai_server(raw(body)) as server:
        engine = make_engine(server.base_url)
        with pytest.raises(EngineResponseError):
            await engine.generate(MESSAGES, SamplingParams())
        await engine.aclose()


async def test_malformed_reply_is_retried() -> None:
    with fake_openai_server(raw(b'{"choices": []}'), reply("second try")) as server:
        engine = make_engine(server.base_url, max_retries=1)
        assert (await engine.generate(MESSAGES, SamplingParams())).text == "second try"
        await engine.aclose()


def test_engine_survives_successive_event_loops() -> None:
    with fake_openai_server(reply("again")) as server:
        engine = make_engine(server.base_url)
        for _ in range(2):  # a sync caller running asyncio.run per question
            assert asyncio.run(engine.generate(MESSAGES, SamplingParams())).text == "again"
        asyncio.run(engine.aclose())


def test_describe_names_the_engine_and_settings() -> None:
    described = make_engine("http://127.0.0.1:1/v1", logprobs=True).describe()
    assert described["engine"] == "openai" and described["model"] == "fake-model"
    assert described["base_url"] == "http://127.0.0.1:1/v1" and described["logprobs"] is True


@pytest.mark.slow
async def test_real_llamacpp_server_answers_with_schema_and_token_ids() -> None:
    schema = {"type": "object", "properties": {"tool": {"enum": ["python", "wikipedia_search"]}},
              "required": ["tool"], "additionalProperties": False}
    with llamacpp_server(n_parallel=2, n_ctx=2048, threads=1) as server:
        engine = make_engine(server.base_url, logprobs=True, timeout_s=60, extra_body={"top_k": 0, "min_p": 0.0})
        completion = await engine.generate([{"role": "user", "content": "Which tool computes 17*23?"}],
                                           SamplingParams(max_tokens=24), json_schema=schema)
        await engine.aclose()
    assert json.loads(completion.text)["tool"] in {"python", "wikipedia_search"}
    assert completion.token_ids and len(completion.token_ids) == len(completion.logprobs or [])
    assert all(lp <= 0.0 for lp in completion.logprobs or [])
    assert completion.prompt_tokens > 0

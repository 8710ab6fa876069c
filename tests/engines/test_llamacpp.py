"""LlamaCppEngine: reply parsing and error mapping (fast), and the real bundled model (slow)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from pathlib import Path

import pytest

from agentflow.clock import QuestionClock, question_clock
from agentflow.config import LlamaCppEngineConfig
from agentflow.engines.base import SamplingParams
from agentflow.engines.llamacpp import NEUTRAL_SAMPLER, LlamaCppEngine, default_threads, parse_chat_response
from agentflow.errors import (
    ConfigError,
    EngineBadRequestError,
    EngineContextOverflowError,
    EngineResponseError,
    EngineServerError,
    EngineUnavailableError,
    ModelNotFoundError,
)

MESSAGES = [{"role": "user", "content": "Hi"}]
PLANNER_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["tool", "sub_goal"],
                  "properties": {"tool": {"enum": ["python", "wikipedia_search"]}, "sub_goal": {"type": "string"}}}


def chat_reply(content: object, *, entries: list[dict] | None = None) -> dict:
    choice: dict = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
    if entries is not None:
        choice["logprobs"] = {"content": entries}
    return {"choices": [choice], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}


def test_parse_reads_text_usage_token_ids_and_logprobs() -> None:
    reply = chat_reply("hi", entries=[{"id": 5, "token": "h", "logprob": -0.5},
                                      {"id": 2, "token": "", "logprob": -0.1}])
    completion = parse_chat_response(reply, model="m", seconds=0.1)
    assert (completion.text, completion.prompt_tokens, completion.completion_tokens) == ("hi", 9, 2)
    assert completion.token_ids == [5, 2] and completion.logprobs == [-0.5, -0.1]
    assert completion.prompt_token_ids is None
    assert completion.cached_prompt_tokens is None  # not reported: unknown, not zero
    assert parse_chat_response({**reply, "timings": {"cache_n": 7}}, model="m", seconds=0.1).cached_prompt_tokens == 7


def test_parse_turns_post_sampling_probabilities_into_logprobs() -> None:
    reply = chat_reply("a", entries=[{"id": 7, "token": "a", "prob": 0.25}, {"id": 2, "token": "", "prob": 1.0}])
    completion = parse_chat_response(reply, model="m", seconds=0.0)
    assert completion.logprobs == pytest.approx([math.log(0.25), 0.0])


@pytest.mark.parametrize(("reply", "error"), [
    ({"error": {"code": 400, "type": "exceed_context_size_error", "message": "request exceeds"}},
     EngineContextOverflowError),
    ({"error": {"code": 400, "type": "invalid_request_error", "message": "bad grammar"}}, EngineBadRequestError),
    ({"error": {"code": 500, "type": "server_error", "message": "decode failed"}}, EngineServerError),
    ({"error": {"code": 503, "type": "unavailable_error", "message": "loading"}}, EngineUnavailableError),
    ({"code": 500, "type": "server_error", "message": "bad utf-8"}, EngineServerError),  # xllamacpp's own shape
    ({"choices": []}, EngineResponseError),
    ({"id": "x"}, EngineResponseError),
    (chat_reply(None), EngineResponseError),
    ("not a dict", EngineResponseError),
])
def test_parse_maps_error_replies_to_typed_errors(reply: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_chat_response(reply, model="m", seconds=0.0)


def test_missing_model_file_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not found"):
        LlamaCppEngine(LlamaCppEngineConfig(model_path=str(tmp_path / "absent.gguf")))


async def test_invalid_gguf_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    engine = LlamaCppEngine(LlamaCppEngineConfig(model_path=str(bad), n_threads=1))
    with pytest.raises(ConfigError, match="not a valid GGUF"):
        await engine.generate([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2))
    await engine.aclose()


def test_request_sends_the_given_settings_and_a_neutral_sampler(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"unused: nothing is loaded")
    engine = LlamaCppEngine(LlamaCppEngineConfig(model_path=str(model)))
    sampling = SamplingParams(temperature=0.6, top_p=0.9, max_tokens=12, seed=3, stop=["END"])
    body = engine.request_body([{"role": "user", "content": "x"}], sampling, PLANNER_SCHEMA)
    assert {k: body[k] for k in ("temperature", "top_p", "max_tokens", "seed", "stop")} == \
        {"temperature": 0.6, "top_p": 0.9, "max_tokens": 12, "seed": 3, "stop": ["END"]}
    assert {k: body[k] for k in NEUTRAL_SAMPLER} == NEUTRAL_SAMPLER
    assert body["response_format"]["json_schema"]["schema"] == PLANNER_SCHEMA
    assert body["post_sampling_probs"] is True
    greedy = engine.request_body([{"role": "user", "content": "x"}], SamplingParams(temperature=0.0))
    assert greedy["post_sampling_probs"] is False and "seed" not in greedy and "response_format" not in greedy
    described = engine.describe()
    assert described["engine"] == "llamacpp" and described["model"] == "m"
    assert described["n_threads"] == default_threads() and 1 <= default_threads() <= 4


@pytest.fixture(scope="module")
def engine() -> LlamaCppEngine:
    return LlamaCppEngine(LlamaCppEngineConfig(n_ctx=2048, n_parallel=2, n_threads=1))


@pytest.mark.slow
def test_bundled_model_answers_constrained_and_concurrently(engine: LlamaCppEngine) -> None:
    async def scenario() -> None:
        messages = [{"role": "user", "content": "Which tool should compute 17 * 23?"}]
        constrained = await engine.generate(messages, SamplingParams(max_tokens=48, temperature=0.8, seed=1),
                                            json_schema=PLANNER_SCHEMA)
        reply = json.loads(constrained.text)
        assert reply["tool"] in {"python", "wikipedia_search"}
        assert constrained.token_ids and len(constrained.token_ids) == len(constrained.logprobs or [])
        assert all(lp <= 1e-6 for lp in constrained.logprobs or [])

        greedy = SamplingParams(max_tokens=24)
        counting = [{"role": "user", "content": "Count from 1 to 30, separated by commas."}]
        before = engine.metrics()
        first, second = await asyncio.gather(engine.generate(counting, greedy), engine.generate(counting, greedy))
        after = engine.metrics()
        assert first.text == second.text and first.text, "greedy decoding is deterministic across slots"
        assert first.completion_tokens == len(first.token_ids or []) > 0
        # both requests shared llama_decode calls (parallel slots), not one after the other; the gauge is a
        # running mean, so compare busy-slot totals
        decodes = after["n_decode_total"] - before["n_decode_total"]
        busy = (after["n_busy_slots_per_decode"] * after["n_decode_total"]
                - before["n_busy_slots_per_decode"] * before["n_decode_total"])
        assert decodes > 0 and busy / decodes > 1.5
        # the same prompt again, alone: llama.cpp reads it from a slot's cache, and says how much it reused
        again = await engine.generate(counting, greedy)
        assert again.cached_prompt_tokens is not None and 0 < again.cached_prompt_tokens < again.prompt_tokens

    asyncio.run(scenario())
    asyncio.run(engine.aclose())


@pytest.mark.slow
def test_a_cancelled_request_stops_inside_llama_cpp_and_frees_its_slot() -> None:
    """Regression: an abandoned request (its question timed out) kept decoding to max_tokens in the only slot
    while the next question waited. Now the stream stops at the next token and the slot serves the next one."""
    engine = LlamaCppEngine(LlamaCppEngineConfig(n_ctx=1024, n_parallel=1, n_threads=1))
    story = [{"role": "user", "content": "Write a very long story about a cat who travels the world."}]

    async def scenario() -> None:
        await engine.generate([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=2))  # load, warm
        before = engine.metrics()["tokens_predicted_total"]
        long = asyncio.create_task(engine.generate(story, SamplingParams(max_tokens=400, temperature=1.0)))
        await asyncio.sleep(1.0)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        short = await engine.generate([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=4))
        assert short.completion_tokens > 0
        spent = engine.metrics()["tokens_predicted_total"] - before
        assert spent < 300, f"the cancelled request went on decoding ({spent} tokens)"

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(engine.aclose())


@pytest.mark.slow
def test_requests_decoded_together_are_each_charged_their_share_of_the_time() -> None:
    """Two questions' requests decoded together in two slots on one thread each take about twice as long as
    alone; each question is charged its share, so together they are charged the time the engine served them,
    not twice it (a 300 s limit fired on a third of the questions at 24 concurrent rollouts otherwise)."""
    engine = LlamaCppEngine(LlamaCppEngineConfig(n_ctx=2048, n_parallel=2, n_threads=1))
    counting = [{"role": "user", "content": "Count from 1 to 40, separated by commas."}]

    async def ask(clock: QuestionClock) -> str:
        with question_clock(clock):
            return (await engine.generate(counting, SamplingParams(max_tokens=48))).text

    async def scenario() -> None:
        await engine.generate(MESSAGES, SamplingParams(max_tokens=1))  # loaded before the clocks start
        clocks = [QuestionClock(), QuestionClock()]
        start = time.perf_counter()
        first, second = await asyncio.gather(*(ask(clock) for clock in clocks))
        elapsed = time.perf_counter() - start
        assert first == second and first
        charged = [clock.active_seconds() for clock in clocks]
        assert sum(charged) <= 1.1 * elapsed + 0.05, (charged, elapsed)
        assert all(clock.waited_seconds() > 0.25 * elapsed for clock in clocks), (charged, elapsed)

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(engine.aclose())


async def test_requests_beyond_the_slots_wait_for_capacity_outside_the_question_clock(tmp_path: Path) -> None:
    """Two requests on one slot: the second waits for the first, and that wait is marked as queue time."""
    engine = LlamaCppEngine(LlamaCppEngineConfig(n_parallel=1))
    release = threading.Event()

    def slow_call(body: dict, cancelled: threading.Event) -> dict:
        release.wait(5)
        return chat_reply("ok")

    engine._call = slow_call  # type: ignore[method-assign]
    first = asyncio.create_task(engine.generate(MESSAGES, SamplingParams(max_tokens=2)))
    await asyncio.sleep(0.05)
    clock = QuestionClock()
    with question_clock(clock):
        second = asyncio.create_task(engine.generate(MESSAGES, SamplingParams(max_tokens=2)))
    await asyncio.sleep(0.3)
    assert clock.waiting and clock.active_seconds() < 0.1
    release.set()
    assert (await first).text == (await second).text == "ok"
    assert not clock.waiting and clock.waited_seconds() >= 0.3
    await engine.aclose()


def test_server_entry_point_reports_a_missing_model(tmp_path: Path) -> None:
    from tests.servers import start_llamacpp_server

    with pytest.raises(RuntimeError, match="not found"):
        start_llamacpp_server(model=str(tmp_path / "absent.gguf"), timeout_s=30)


@pytest.mark.slow
def test_requantized_bundled_model_is_cached_and_answers_like_the_original(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTFLOW_CACHE", str(tmp_path))
    config = LlamaCppEngineConfig(n_ctx=1024, n_parallel=1, n_threads=1, requantize="q8_0")
    requantized = LlamaCppEngine(config)
    path = requantized.model_path
    assert path.parent.parent == tmp_path and path.name.endswith(".q8_0.gguf")
    stamp = path.stat().st_mtime_ns
    assert LlamaCppEngine(config).model_path == path and path.stat().st_mtime_ns == stamp  # cached, not rewritten
    original = LlamaCppEngine(LlamaCppEngineConfig(n_ctx=1024, n_parallel=1, n_threads=1))
    question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]

    async def answer(engine: LlamaCppEngine) -> str:
        try:
            return (await engine.generate(question, SamplingParams(max_tokens=8))).text
        finally:
            await engine.aclose()

    assert "Paris" in asyncio.run(answer(requantized)) and "Paris" in asyncio.run(answer(original))

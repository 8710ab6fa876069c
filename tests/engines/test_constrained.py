"""JSON-schema-constrained decoding in the transformers engine (llguidance): a tiny random model with a
byte-level tokenizer (fast: any reply it writes is pure chance), and the bundled model (slow)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from agentflow.config import TransformersEngineConfig
from agentflow.engines.base import SamplingParams
from agentflow.engines.hf import TransformersEngine
from agentflow.errors import EngineBadRequestError
from agentflow.planner import parse_planner_reply, planner_messages, planner_schema
from tests.engines.test_hf import CHAT_TEMPLATE, ask, tiny_model

SCHEMA = {
    "type": "object",
    "properties": {"tool_name": {"type": "string", "enum": ["python", "wikipedia_search"]},
                   "sub_goal": {"type": "string", "maxLength": 12}},
    "required": ["tool_name", "sub_goal"],
    "additionalProperties": False,
}


def byte_tokenizer(merges: tuple[tuple[str, str], ...] = ()) -> PreTrainedTokenizerFast:
    """One token per byte plus the chat specials: it can spell any JSON. `merges`: pairs of ASCII characters that
    are one token as well (("p", "y"): "py"), so that a word can start with either of two tokens."""
    specials = ["<pad>", "<|im_start|>", "<|im_end|>"]
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = specials + alphabet + [a + b for a, b in merges]
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=list(merges)))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<|im_end|>",
                                        bos_token="<|im_start|>", additional_special_tokens=specials)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture
def engine() -> TransformersEngine:
    torch.set_num_threads(1)
    tokenizer = byte_tokenizer()
    return TransformersEngine(TransformersEngineConfig(device="cpu", max_batch_size=8),
                              model=tiny_model(tokenizer), tokenizer=tokenizer)


async def test_every_sampled_reply_follows_the_schema(engine: TransformersEngine) -> None:
    assert engine.supports_json_schema
    sampling = SamplingParams(temperature=1.0, max_tokens=80, seed=1)
    replies = await asyncio.gather(*(engine.generate(ask(f"question {i}"), sampling, json_schema=SCHEMA)
                                     for i in range(8)))
    assert engine.batch_sizes == [8]
    for reply in replies:
        value = json.loads(reply.text)
        assert value["tool_name"] in {"python", "wikipedia_search"} and len(value["sub_goal"]) <= 12
        assert reply.finish_reason == "stop" and reply.token_ids[-1] == engine.tokenizer.eos_token_id


async def test_unconstrained_replies_of_the_random_model_are_not_json(engine: TransformersEngine) -> None:
    sampling = SamplingParams(temperature=1.0, max_tokens=40, seed=1)
    replies = await asyncio.gather(*(engine.generate(ask(f"question {i}"), sampling) for i in range(8)))
    assert not any(reply.text.startswith('{"') for reply in replies)  # so the test above tests the mask


def masked_logprobs(engine: TransformersEngine, reply, temperature: float, schema=SCHEMA) -> torch.Tensor:
    """The trainer's view: a forward pass over prompt + reply, log softmax of logits / T over the tokens the
    replayed schema allowed at each position."""
    prompt, tokens = reply.prompt_token_ids, reply.token_ids
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1: -1]
    scaled = logits / temperature if temperature > 0 else logits
    allowed = engine.allowed_tokens(schema, tokens)
    scaled = scaled.masked_fill(~allowed, float("-inf"))
    return torch.log_softmax(scaled, dim=-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
async def test_logprobs_are_those_of_the_masked_distribution_sampled_from(engine: TransformersEngine,
                                                                           temperature: float) -> None:
    """Regression: the engine reported the unmasked model's log-probs, so forced tokens looked like choices
    (and the trainer pushed probability onto tokens the sampler could never emit). Now the reported numbers
    are those of the masked distribution, which the trainer rebuilds from the ids: the ratio is exactly 1."""
    sampling = SamplingParams(temperature=temperature, max_tokens=60, seed=2)
    reply = await engine.generate(ask("the cat"), sampling, json_schema=SCHEMA)
    recomputed = masked_logprobs(engine, reply, temperature)
    assert torch.allclose(torch.tensor(reply.logprobs), recomputed, atol=1e-4)
    allowed = engine.allowed_tokens(SCHEMA, reply.token_ids)
    forced = allowed.sum(-1) == 1
    assert forced[:3].all() and not forced.all()  # '{"tool_name": "' is forced; the tool is a choice
    assert all(reply.logprobs[i] == 0.0 for i in forced.nonzero().flatten().tolist())


def test_replay_rebuilds_the_masks_decoding_applied(engine: TransformersEngine) -> None:
    tokenizer = engine.tokenizer
    text = '{"tool_name": "python", "sub_goal": "add"}'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    allowed = engine.allowed_tokens(SCHEMA, ids)
    assert allowed.shape == (len(ids), engine.model.get_output_embeddings().weight.shape[0])
    assert all(allowed[t, token] for t, token in enumerate(ids))  # every drawn token was allowed
    quote = tokenizer.convert_tokens_to_ids('"')
    opening = tokenizer.convert_tokens_to_ids("{")
    assert allowed[0].nonzero().flatten().tolist() == [opening]
    choice = len(tokenizer('{"tool_name": "', add_special_tokens=False)["input_ids"])
    p, w = tokenizer.convert_tokens_to_ids("p"), tokenizer.convert_tokens_to_ids("w")
    assert sorted(allowed[choice].nonzero().flatten().tolist()) == sorted([p, w])
    assert allowed[-1].nonzero().flatten().tolist() == [tokenizer.eos_token_id]  # complete: only the end
    assert not allowed[choice, quote]


async def test_requests_with_and_without_a_schema_are_batched_apart(engine: TransformersEngine) -> None:
    sampling = SamplingParams(temperature=0.0, max_tokens=80)
    free, constrained = await asyncio.gather(engine.generate(ask("a"), sampling),
                                             engine.generate(ask("a"), sampling, json_schema=SCHEMA))
    assert sorted(engine.batch_sizes) == [1, 1]
    assert json.loads(constrained.text)["tool_name"] and free.text != constrained.text


async def test_an_unusable_schema_is_a_bad_request(engine: TransformersEngine) -> None:
    with pytest.raises(EngineBadRequestError, match="not usable for constrained decoding"):
        await engine.generate(ask("a"), SamplingParams(max_tokens=5), json_schema={"type": "no-such-type"})


def test_constrained_decoding_can_be_switched_off() -> None:
    tokenizer = byte_tokenizer()
    engine = TransformersEngine(TransformersEngineConfig(device="cpu", json_schema=False),
                                model=tiny_model(tokenizer), tokenizer=tokenizer)
    assert not engine.supports_json_schema


@pytest.mark.slow
@pytest.mark.parametrize("tool_last", [False, True])
async def test_bundled_planner_replies_name_an_enabled_tool(tool_last: bool) -> None:
    """In either order of the reply's fields (the tool first, or last as the paper's planner writes it)."""
    engine = TransformersEngine(TransformersEngineConfig(device="cpu", max_batch_size=8))
    tools = {"python": "Runs Python code.", "wikipedia_search": "Searches Wikipedia.",
             "base_generator": "Answers from its own knowledge."}
    questions = ["What is 6873 * 683?", "What nationality was Frédéric Chopin?", "Who wrote Hamlet?",
                 "How many primes are below 100?"]
    # tool last: the 40 characters of sub-goal and context (limits.plan_chars of the mixed task) come first
    schema = planner_schema(list(tools), text_chars=40, tool_last=True) if tool_last else planner_schema(list(tools))
    max_tokens = 200 if tool_last else 96

    def messages(question: str) -> list[dict[str, str]]:
        return planner_messages(question=question, analysis="", tool_descriptions=tools, memory="(none)", turn=1,
                                max_turns=1, tool_last=tool_last)

    try:
        replies = await asyncio.gather(*(
            engine.generate(messages(q), SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i),
                            json_schema=schema)
            for i, q in enumerate(questions)))
    finally:
        await engine.aclose()
    for reply in replies:
        step = parse_planner_reply(reply.text, list(tools))
        assert step.tool_name in tools, reply.text
        if reply.finish_reason == "stop":  # not cut off by max_tokens: a whole, valid reply
            assert step.well_formed and set(json.loads(reply.text)) == {"tool_name", "sub_goal", "context"}
            assert (list(json.loads(reply.text))[-1] == "tool_name") is tool_last

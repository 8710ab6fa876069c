"""TransformersEngine on a tiny random Llama built here (fast), and on the bundled GGUF (slow)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from agentflow.config import TransformersEngineConfig
from agentflow.engines.base import SamplingParams
from agentflow.engines.hf import TransformersEngine, gguf_checkpoint, load_policy, resolve_model_source
from agentflow.errors import EngineBadRequestError, ModelNotFoundError

WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "far", "away", "python", "search", "answer",
         "is", "what", "who", "why", "tool", "query", "paris", "france", "red", "blue", "green", "one", "two"]
SPECIAL = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
ROLES = ["system", "user", "assistant"]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIAL + ROLES + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                                        eos_token="<|im_end|>", bos_token="<|im_start|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_model(tokenizer: PreTrainedTokenizerFast, *, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.5, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(autouse=True)
def one_torch_thread() -> object:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def engine() -> TransformersEngine:
    tokenizer = tiny_tokenizer()
    return TransformersEngine(TransformersEngineConfig(device="cpu", max_batch_size=8),
                              model=tiny_model(tokenizer), tokenizer=tokenizer)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def recomputed_logprobs(engine: TransformersEngine, prompt: list[int], tokens: list[int],
                        temperature: float) -> torch.Tensor:
    """The trainer's view: one forward pass over prompt + reply, log_softmax(logits / T) at the reply."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1: -1]
    scaled = logits / temperature if temperature > 0 else logits
    return torch.log_softmax(scaled, dim=-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


async def test_sampled_logprobs_match_a_forward_pass_at_temperature(engine: TransformersEngine) -> None:
    prompts = ["what is the cat", "who ran far away from the dog on the mat", "why"]  # unequal: left padding
    sampling = SamplingParams(temperature=0.7, max_tokens=10, seed=3)
    completions = await asyncio.gather(*(engine.generate(ask(p), sampling) for p in prompts))
    assert engine.batch_sizes == [3]
    for completion in completions:
        assert completion.prompt_token_ids and completion.token_ids and completion.logprobs
        assert len(completion.token_ids) == len(completion.logprobs) == completion.completion_tokens
        expected = recomputed_logprobs(engine, completion.prompt_token_ids, completion.token_ids, 0.7)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)


async def test_the_checkpoints_own_sampling_defaults_never_act(engine: TransformersEngine) -> None:
    """A checkpoint's generation_config (min_p, repetition penalty, top_k) must not filter rollouts: the
    trainer recomputes plain tempered log-probs, so anything else would make them disagree."""
    own = engine.model.generation_config
    own.min_p, own.repetition_penalty, own.top_k, own.typical_p = 0.3, 1.8, 3, 0.5
    sampling = SamplingParams(temperature=1.0, max_tokens=12, seed=5)
    completions = await asyncio.gather(*(engine.generate(ask(p), sampling) for p in ("what is the cat", "why")))
    for completion in completions:
        expected = recomputed_logprobs(engine, completion.prompt_token_ids or [], completion.token_ids or [], 1.0)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)
    assert engine.model.generation_config is own and own.min_p == 0.3  # left as the checkpoint had it


async def test_greedy_is_argmax_with_raw_logprobs_and_unaffected_by_batching(engine: TransformersEngine) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    alone = await engine.generate(ask("the dog sat"), greedy)
    together = await asyncio.gather(engine.generate(ask("the dog sat"), greedy),
                                    engine.generate(ask("what is the answer to the query on paris"), greedy))
    assert engine.batch_sizes == [1, 2]
    assert together[0].token_ids == alone.token_ids and together[0].text == alone.text
    expected = recomputed_logprobs(engine, alone.prompt_token_ids or [], alone.token_ids or [], 0.0)
    assert torch.allclose(torch.tensor(alone.logprobs), expected, atol=1e-4)
    ids = torch.tensor([(alone.prompt_token_ids or []) + (alone.token_ids or [])])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, len(alone.prompt_token_ids or []) - 1: -1]
    assert logits.argmax(-1).tolist() == alone.token_ids


async def test_batches_group_identical_sampling_and_respect_max_batch_size() -> None:
    tokenizer = tiny_tokenizer()
    engine = TransformersEngine(TransformersEngineConfig(device="cpu", max_batch_size=2),
                                model=tiny_model(tokenizer), tokenizer=tokenizer)
    cold, warm = SamplingParams(temperature=0.0, max_tokens=3), SamplingParams(temperature=1.0, max_tokens=3)
    requests = [engine.generate(ask(w), s) for w, s in [("cat", cold), ("dog", warm), ("mat", cold),
                                                          ("red", warm), ("blue", cold)]]
    completions = await asyncio.gather(*requests)
    # greedy rows read max_tokens; a sampled row may draw the end token first (its stream is not seeded)
    assert all(len(c.token_ids or []) == 3 for c in completions[::2])
    assert all(len(c.token_ids or []) == 3 or c.finish_reason == "stop" for c in completions[1::2])
    assert sorted(engine.batch_sizes) == [1, 2, 2]
    await engine.aclose()


async def test_eos_ends_a_row_and_padding_after_it_is_dropped(engine: TransformersEngine) -> None:
    eos = engine.tokenizer.eos_token_id
    with engine.updating_weights() as model, torch.no_grad():  # make the end token likely, not certain
        head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[eos] = 1.0
        model.lm_head = head
    assert engine.weights_version == 1
    sampling = SamplingParams(temperature=1.0, max_tokens=12, seed=0)
    completions = await asyncio.gather(*(engine.generate(ask(w), sampling) for w in WORDS[:8]))
    finished = [c for c in completions if c.finish_reason == "stop"]
    truncated = [c for c in completions if c.finish_reason == "length"]
    assert finished and truncated, "the seeded draw should end some rows early and not others"
    for c in finished:
        assert c.token_ids and c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
        assert len(c.logprobs or []) == len(c.token_ids) < 12
        assert "<|im_end|>" not in c.text
    for c in truncated:
        assert len(c.token_ids or []) == 12 and eos not in (c.token_ids or [])


async def test_stop_string_cuts_text_and_tokens(engine: TransformersEngine) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    full = await engine.generate(ask("the cat"), greedy)
    words = full.text.split()
    assert len(words) >= 4
    stop_word = words[2]
    first = words.index(stop_word)
    cut = await engine.generate(ask("the cat"), greedy.model_copy(update={"stop": [stop_word]}))
    assert cut.finish_reason == "stop"
    assert cut.text.split() == words[:first]
    assert cut.token_ids == (full.token_ids or [])[: first + 1]


async def test_seed_reproduces_and_leaves_the_global_rng_alone(engine: TransformersEngine) -> None:
    sampling = SamplingParams(temperature=1.0, max_tokens=6, seed=11)
    state = torch.get_rng_state()
    first = await engine.generate(ask("green tool"), sampling)
    second = await engine.generate(ask("green tool"), sampling)
    assert first.token_ids == second.token_ids
    assert torch.equal(state, torch.get_rng_state())


async def test_unseeded_calls_draw_fresh_samples_and_leave_the_global_rng_alone(engine: TransformersEngine) -> None:
    """Regression: sampling under a forked RNG used to restart from the same global state on every call, so
    the same prompt got the same 'random' reply, call after call (and rollout groups were copies)."""
    sampling = SamplingParams(temperature=1.0, max_tokens=12)
    state = torch.get_rng_state()
    replies = [await engine.generate(ask("green tool"), sampling) for _ in range(3)]
    assert len({tuple(r.token_ids or []) for r in replies}) == 3
    assert torch.equal(state, torch.get_rng_state())


async def test_sampling_stream_restarts_from_its_seed_and_resumes_from_a_saved_state() -> None:
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)

    def make(seed: int) -> TransformersEngine:
        return TransformersEngine(TransformersEngineConfig(device="cpu", seed=seed), model=model, tokenizer=tokenizer)

    sampling = SamplingParams(temperature=1.0, max_tokens=10)

    async def draw(engine: TransformersEngine, n: int) -> list[list[int]]:
        return [(await engine.generate(ask(f"the {w}"), sampling)).token_ids or [] for w in WORDS[:n]]

    uninterrupted = await draw(make(5), 4)
    assert uninterrupted == await draw(make(5), 4)
    assert uninterrupted != await draw(make(6), 4)
    interrupted = make(5)
    first = await draw(interrupted, 2)
    resumed = make(99)
    resumed.load_sampling_state(interrupted.sampling_state())
    rest = [(await resumed.generate(ask(f"the {w}"), sampling)).token_ids for w in WORDS[2:4]]
    assert first + rest == uninterrupted


async def test_generation_waits_for_a_weight_update(engine: TransformersEngine) -> None:
    entered, release = threading.Event(), threading.Event()
    finished_update: list[float] = []

    def optimizer_step() -> None:
        with engine.updating_weights():
            entered.set()
            release.wait(5)
            finished_update.append(time.perf_counter())

    updater = threading.Thread(target=optimizer_step)
    updater.start()
    entered.wait(5)
    request = asyncio.ensure_future(engine.generate(ask("cat"), SamplingParams(max_tokens=2)))
    await asyncio.sleep(0.2)
    assert not request.done(), "no generate may run during an optimizer step"
    release.set()
    completion = await request
    updater.join()
    assert completion.token_ids and finished_update
    assert engine.weights_version == 1


async def test_prompt_beyond_the_context_is_a_bad_request(engine: TransformersEngine) -> None:
    with pytest.raises(EngineBadRequestError, match="exceeds the model's context"):
        await engine.generate(ask("the cat " * 70), SamplingParams(max_tokens=8))


async def test_loads_a_checkpoint_directory_and_a_peft_adapter(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    lora = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(tmp_path / "adapter")

    config = TransformersEngineConfig(model=str(tmp_path / "base"), adapter=str(tmp_path / "adapter"),
                                      device="cpu", n_threads=1)
    policy, policy_tokenizer = load_policy(config, trainable=True)
    assert type(policy).__name__ == "PeftModel" and policy.training
    assert any(p.requires_grad for p in policy.parameters()) and policy_tokenizer.padding_side == "left"

    engine = TransformersEngine(config)
    assert engine.describe()["model"] == "base" and engine.describe()["adapter"] == str(tmp_path / "adapter")
    completion = await engine.generate(ask("the cat"), SamplingParams(max_tokens=4))
    assert len(completion.token_ids or []) == 4
    await engine.aclose()


def test_missing_models_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="nothing is downloaded"):
        resolve_model_source(str(tmp_path / "absent"))
    with pytest.raises(ModelNotFoundError, match="nothing is downloaded"):
        TransformersEngine(TransformersEngineConfig(model="HuggingFaceTB/SmolLM2-135M-Instruct"))
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match="adapter"):
        load_policy(TransformersEngineConfig(model=str(tmp_path / "base"), adapter=str(tmp_path / "none")))


@pytest.mark.slow
def test_bundled_gguf_loads_cached_and_answers() -> None:
    from agentflow.bundled import bundled_model_path

    checkpoint = gguf_checkpoint(bundled_model_path())  # converts once (~30 s), then cached
    started = time.perf_counter()
    assert gguf_checkpoint(bundled_model_path()) == checkpoint
    assert time.perf_counter() - started < 1.0
    engine = TransformersEngine(TransformersEngineConfig(device="cpu", n_threads=1))

    async def scenario() -> None:
        completion = await engine.generate(ask("What is the capital of France?"), SamplingParams(max_tokens=16))
        assert "Paris" in completion.text
        assert completion.prompt_token_ids and completion.token_ids
        await engine.aclose()

    asyncio.run(scenario())
    assert engine.load_seconds is not None and engine.load_seconds < 10


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("dtype", "tolerance"), [("auto", 0.1), ("float32", 1e-3)])
def test_cuda_loads_batches_and_matches_recomputed_logprobs(tmp_path: Path, dtype: str, tolerance: float) -> None:
    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = TransformersEngine(TransformersEngineConfig(model=str(tmp_path), dtype=dtype))  # device auto
    expected_dtype = torch.bfloat16 if dtype == "auto" and torch.cuda.is_bf16_supported() else torch.float32
    assert engine.device.type == "cuda" and engine.dtype == expected_dtype
    sampling = SamplingParams(temperature=0.8, max_tokens=16, seed=0)

    async def scenario() -> list:
        replies = await asyncio.gather(*(engine.generate(ask(w), sampling) for w in WORDS[:6]))
        await engine.aclose()
        return replies

    completions = asyncio.run(scenario())
    assert engine.batch_sizes == [6]
    assert next(engine.model.parameters()).dtype == expected_dtype
    for completion in completions:
        ids = torch.tensor([(completion.prompt_token_ids or []) + (completion.token_ids or [])], device="cuda")
        with torch.no_grad():
            logits = engine.model(input_ids=ids).logits[0, len(completion.prompt_token_ids or []) - 1: -1].float()
        expected = torch.log_softmax(logits / 0.8, -1).gather(
            1, torch.tensor(completion.token_ids, device="cuda")[:, None]).squeeze(1).cpu()
        difference = (torch.tensor(completion.logprobs) - expected).abs()
        assert difference.mean() < tolerance, f"{dtype}: mean |Δ log-prob| {difference.mean():.4f}"

"""Engine speed: load time and generated tokens per second, one request at a time and concurrently.

Prints one JSON object per measurement. Usage:
  python benchmarks/engine_speed.py llamacpp [--threads N] [--concurrency 4]
  python benchmarks/engine_speed.py hf [--threads N] [--batch 8] [--fresh-cache]
  python benchmarks/engine_speed.py hf-random --device cuda [--batch 8]   # SmolLM2-135M shape, random weights

Tokens/s counts the tokens the engine really returned (replies may end early at end-of-sequence), divided
by wall time of the whole round, so concurrent numbers include the batching gain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from typing import Any

from agentflow.config import LlamaCppEngineConfig, TransformersEngineConfig
from agentflow.engines.base import Engine, SamplingParams

PROMPTS = [f"Write a long story about {topic}." for topic in
           ("a lighthouse keeper", "a lost dog", "the first rain on Mars", "a chess match", "an old clock",
            "a mountain village", "a robot who paints", "the last library", "a river crossing", "a kite")]


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def round_of(engine: Engine, n: int, sampling: SamplingParams) -> tuple[int, float]:
    started = time.perf_counter()
    replies = await asyncio.gather(*(engine.generate([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                                     sampling)
                                     for i in range(n)))
    return sum(r.completion_tokens for r in replies), time.perf_counter() - started


async def measure(engine: Engine, name: str, concurrency: list[int], max_tokens: int, repeats: int) -> None:
    sampling = SamplingParams(temperature=0.7, max_tokens=max_tokens)
    await round_of(engine, 1, sampling.model_copy(update={"max_tokens": 4}))  # warm-up
    for n in concurrency:
        tokens, seconds = 0, 0.0
        for _ in range(repeats):
            t, s = await round_of(engine, n, sampling)
            tokens, seconds = tokens + t, seconds + s
        emit(engine=name, concurrent=n, tokens=tokens, seconds=round(seconds, 2),
             tokens_per_s=round(tokens / seconds, 1))


async def bench_llamacpp(args: argparse.Namespace) -> None:
    from agentflow.engines.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine(LlamaCppEngineConfig(n_threads=args.threads, n_parallel=max(args.concurrency)))
    engine.load()
    emit(engine="llamacpp", load_s=round(engine.load_seconds or 0.0, 2), n_threads=engine.n_threads,
         omp_wait_policy=os.environ.get("OMP_WAIT_POLICY", "(unset)"))
    await measure(engine, "llamacpp", args.concurrency, args.max_tokens, args.repeats)
    await engine.aclose()


async def bench_hf(args: argparse.Namespace) -> None:
    import torch

    from agentflow.engines.hf import TransformersEngine

    if args.fresh_cache:
        os.environ["AGENTFLOW_CACHE"] = tempfile.mkdtemp(prefix="agentflow-bench-")
    config = TransformersEngineConfig(device=args.device, n_threads=args.threads,
                                      max_batch_size=max(args.concurrency))
    for attempt in ("first" if args.fresh_cache else "cached", "cached"):
        started = time.perf_counter()
        engine = TransformersEngine(config)
        engine.load()
        emit(engine="hf", load=attempt, load_s=round(time.perf_counter() - started, 2),
             device=str(engine.device), dtype=str(engine.dtype), torch_threads=torch.get_num_threads())
    await measure(engine, "hf", args.concurrency, args.max_tokens, args.repeats)
    await engine.aclose()


async def bench_hf_random(args: argparse.Namespace) -> None:
    """The bundled model's architecture with random weights: GPU numbers where the GGUF cannot travel."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from agentflow.engines.hf import TransformersEngine, resolve_device, resolve_dtype

    words = [f"w{i}" for i in range(49152 - 4)]
    vocab = {t: i for i, t in enumerate(["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", *words])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                                        eos_token="<|im_end|>")
    tokenizer.chat_template = ("{% for m in messages %}<|im_start|> {{ m['content'] }} <|im_end|> {% endfor %}"
                               "{% if add_generation_prompt %}<|im_start|> {% endif %}")
    device = resolve_device(args.device)
    shape = LlamaConfig(vocab_size=len(vocab), hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                        tie_word_embeddings=True, eos_token_id=3, pad_token_id=0)
    model = LlamaForCausalLM(shape).to(device=device, dtype=resolve_dtype("auto", device)).eval()
    engine = TransformersEngine(TransformersEngineConfig(device=args.device, max_batch_size=max(args.concurrency)),
                                model=model, tokenizer=tokenizer)
    emit(engine="hf-random", device=str(engine.device), dtype=str(engine.dtype),
         gpu=torch.cuda.get_device_name() if device.type == "cuda" else None)
    await measure(engine, "hf-random", args.concurrency, args.max_tokens, args.repeats)
    await engine.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", choices=["llamacpp", "hf", "hf-random"])
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the engine's)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4],
                        help="concurrent requests per round (hf: also the batch size)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--fresh-cache", action="store_true", help="hf: time the first GGUF conversion too")
    args = parser.parse_args()
    runner = {"llamacpp": bench_llamacpp, "hf": bench_hf, "hf-random": bench_hf_random}[args.engine]
    asyncio.run(runner(args))


if __name__ == "__main__":
    main()

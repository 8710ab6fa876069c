"""Seconds per phase and update tokens/s of our Flow-GRPO update next to TRL's GRPOTrainer, same work.

Same model, same B x G sequences of the same prompt and completion lengths (completions are forced to full
length with min_new_tokens on both sides), same LoRA or full fine-tuning, one optimiser step per step, all
rows in one micro-batch on both sides. Phases:
- rollout: sampling the B x G completions (both: `model.generate` of transformers);
- ref: reference log-probs (only with --beta > 0; ours: adapter disabled, TRL: its own way);
- update: forward, backward and optimiser step. TRL also recomputes nothing else when num_iterations is 1.
Each side runs in its own subprocess, so peak memory (CUDA: max allocated; CPU: max RSS) is its own.

    python benchmarks/train_vs_trl.py --device cpu                      # the bundled model, small shapes
    python benchmarks/train_vs_trl.py --device cuda --batch 8 --group 8  # bf16 on a GPU

TRL is an optional dependency of this script only (`pip install trl`). Prints one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                    rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1,
                    eos_token_id=2, pad_token_id=2)


@dataclass
class Row:
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]


def peak_memory_mb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class PhasePeaks:
    """Peak memory per phase: CUDA max allocated, or on CPU the largest resident set seen by a sampler
    thread (every 2 ms) while the phase ran. `mark(name)` closes the phase that ran since the last mark."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.peaks: dict[str, float] = {}
        self._current = 0.0
        self._stop = threading.Event()
        if not self.cuda:
            threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/statm") as statm:
            while not self._stop.wait(0.002):
                statm.seek(0)
                self._current = max(self._current, int(statm.read().split()[1]) * page / 2**20)

    def mark(self, name: str | None) -> None:
        if self.cuda:
            peak = torch.cuda.max_memory_allocated() / 2**20
            torch.cuda.reset_peak_memory_stats()
        else:
            peak, self._current = self._current, 0.0
        if name is not None:
            self.peaks[name] = round(max(self.peaks.get(name, 0.0), peak), 1)


def resolve_model(args: argparse.Namespace) -> str:
    """A local HF checkpoint directory: given, random-initialised SmolLM2-135M shape, or the bundled model."""
    if args.model == "bundled":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
        from agentflow.bundled import bundled_model_path
        from agentflow.engines.hf import gguf_checkpoint

        return str(gguf_checkpoint(bundled_model_path()))
    if args.model == "random":
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        if not args.tokenizer:
            raise SystemExit("--model random needs --tokenizer DIR (any SmolLM2 tokenizer directory)")
        out = Path(args.workdir) / "random-smollm2-135m"
        if not (out / "config.json").is_file():
            torch.manual_seed(0)
            LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).save_pretrained(out)
            AutoTokenizer.from_pretrained(args.tokenizer).save_pretrained(out)
        return str(out)
    return args.model


def prompts(tokenizer, n: int, length: int, seed: int) -> list[str]:
    """n different plain-text prompts of about `length` tokens."""
    rng = random.Random(seed)
    words = ["apple", "river", "number", "planet", "seven", "music", "table", "green", "python", "search"]
    out = []
    for _ in range(n):
        text = " ".join(rng.choice(words) for _ in range(length))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:length]
        out.append(tokenizer.decode(ids))
    return out


def load(args: argparse.Namespace, path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(args.device)
    return model, tokenizer


def lora_config(args: argparse.Namespace):
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


# -- ours ----------------------------------------------------------------------------------------------------


def run_ours(args: argparse.Namespace, path: str) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from transformers import GenerationConfig

    from agentflow.train.logprobs import micro_batches, pack_rows, plain_lm_head, response_logprobs
    from agentflow.train.losses import clipped_surrogate_loss, row_weights

    model, tokenizer = load(args, path)
    if args.lora:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(args))
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    chunked = plain_lm_head(model) and not args.full_logits
    n = args.batch * args.group
    texts = prompts(tokenizer, args.batch, args.prompt_len, args.seed)
    gen = GenerationConfig(max_new_tokens=args.completion_len, min_new_tokens=args.completion_len, do_sample=True,
                           temperature=1.0, top_p=1.0, top_k=0, output_scores=True, return_dict_in_generate=True,
                           pad_token_id=tokenizer.pad_token_id)
    phases: dict[str, list[float]] = {"rollout": [], "ref": [], "update": []}
    peaks = PhasePeaks(args.device)
    update_tokens = 0
    for step in range(args.warmup + args.steps):
        peaks.mark(None)
        batch = [t for t in texts for _ in range(args.group)]
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(args.device)
        sync(args.device)
        start = time.perf_counter()
        model.eval()
        with torch.inference_mode():
            out = model.generate(**enc, generation_config=gen)
        width = enc["input_ids"].shape[1]
        generated = out.sequences[:, width:]
        logps = torch.stack([torch.log_softmax(s.float(), -1).gather(1, generated[:, t:t + 1]).squeeze(1)
                             for t, s in enumerate(out.scores)], 1)
        rows = []
        for i in range(n):
            prompt = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
            rows.append(Row(prompt, generated[i].tolist(), logps[i].tolist()))
        sync(args.device)
        rollout = time.perf_counter() - start
        peaks.mark("rollout")

        start = time.perf_counter()
        batches = micro_batches(rows, max_rows=n, max_tokens=10**9)
        ref: dict[int, torch.Tensor] = {}
        if args.beta > 0:
            ctx = model.disable_adapter() if args.lora else torch.no_grad()
            with torch.no_grad(), ctx:
                for idx in batches:
                    packed = pack_rows([rows[i] for i in idx], pad_id=tokenizer.pad_token_id, device=args.device)
                    lp, _, _ = response_logprobs(model, packed, chunked_head=chunked)
                    ref.update({i: lp[j] for j, i in enumerate(idx)})
        sync(args.device)
        ref_s = time.perf_counter() - start
        peaks.mark("ref")

        start = time.perf_counter()
        model.train()
        optimizer.zero_grad(set_to_none=True)
        advantages = torch.randn(n)
        # TRL's default loss weighs every token alike: the same weights on our side
        weights = row_weights("token_mean", response_lengths=torch.tensor([len(r.response_ids) for r in rows]))
        for idx in batches:
            packed = pack_rows([rows[i] for i in idx], pad_id=tokenizer.pad_token_id, device=args.device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.device.startswith("cuda")):
                lp, entropy, _ = response_logprobs(model, packed, with_entropy=False, chunked_head=chunked)
            result = clipped_surrogate_loss(
                logprobs=lp, old_logprobs=packed.old_logprobs, advantages=advantages[idx].to(args.device),
                mask=packed.response_mask, ref_logprobs=torch.stack([ref[i] for i in idx]) if ref else None,
                kl_coef=args.beta, weights=weights[idx].to(args.device))
            result.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        sync(args.device)
        update = time.perf_counter() - start
        peaks.mark("update")
        if step >= args.warmup:
            phases["rollout"].append(rollout)
            phases["ref"].append(ref_s)
            phases["update"].append(update)
            update_tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    result = summarise(phases, update_tokens, args)
    result["peak_memory_mb_by_phase"] = peaks.peaks
    return result


# -- TRL -----------------------------------------------------------------------------------------------------


def run_trl(args: argparse.Namespace, path: str) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = load(args, path)
    n = args.batch * args.group
    texts = prompts(tokenizer, args.batch, args.prompt_len, args.seed)
    total_steps = args.warmup + args.steps
    dataset = Dataset.from_dict({"prompt": texts * total_steps})
    cuda = args.device.startswith("cuda")
    config = GRPOConfig(
        output_dir=str(Path(args.workdir) / "trl"), per_device_train_batch_size=n, num_generations=args.group,
        gradient_accumulation_steps=1, steps_per_generation=1, max_completion_length=args.completion_len,
        generation_kwargs={"min_new_tokens": args.completion_len}, temperature=1.0, top_p=1.0,
        beta=args.beta, num_iterations=1, learning_rate=1e-5, max_steps=total_steps, logging_steps=1,
        report_to=[], save_strategy="no", bf16=cuda, use_cpu=not cuda, seed=args.seed, shuffle_dataset=False,
        disable_tqdm=True, dataloader_num_workers=0, gradient_checkpointing=args.gradient_checkpointing)

    def reward(completions, **kwargs):
        return [random.random() for _ in completions]

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, peft_config=lora_config(args) if args.lora else None)
    timing: dict[str, float] = {"generate": 0.0, "prepare": 0.0}
    counts = {"tokens": 0}
    peaks = PhasePeaks(args.device)
    original_generate, original_prepare = trainer._generate, trainer._prepare_inputs

    def timed_generate(*a, **k):
        sync(args.device)
        peaks.mark("ref")
        start = time.perf_counter()
        out = original_generate(*a, **k)
        sync(args.device)
        timing["generate"] += time.perf_counter() - start
        peaks.mark("rollout")
        return out

    def timed_prepare(*a, **k):
        sync(args.device)
        peaks.mark(None)
        start = time.perf_counter()
        out = original_prepare(*a, **k)
        sync(args.device)
        timing["prepare"] += time.perf_counter() - start
        peaks.mark("ref")
        counts["tokens"] = int(out["prompt_mask"].sum() + out["completion_mask"].sum())
        return out

    trainer._generate, trainer._prepare_inputs = timed_generate, timed_prepare
    phases: dict[str, list[float]] = {"rollout": [], "ref": [], "update": []}

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            sync(args.device)
            timing.update(generate=0.0, prepare=0.0, begin=time.perf_counter())

        def on_step_end(self, state_args, state, control, **k):
            sync(args.device)
            peaks.mark("update")
            step_s = time.perf_counter() - timing["begin"]
            if state.global_step > args.warmup:
                phases["rollout"].append(timing["generate"])
                # everything _prepare_inputs does besides generating: rewards, old/ref log-probs
                phases["ref"].append(timing["prepare"] - timing["generate"])
                phases["update"].append(step_s - timing["prepare"])

    trainer.add_callback(Timer())
    trainer.train()
    return {**summarise(phases, counts["tokens"], args), "peak_memory_mb_by_phase": peaks.peaks}


def summarise(phases: dict[str, list[float]], update_tokens: int, args: argparse.Namespace) -> dict:
    seconds = {k: round(statistics.median(v), 4) if v else None for k, v in phases.items()}
    return {"seconds_per_phase": seconds, "update_tokens": update_tokens,
            "update_tokens_per_s": round(update_tokens / seconds["update"], 1) if seconds["update"] else None,
            "peak_memory_mb": round(peak_memory_mb(args.device), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--model", default="bundled", help="HF checkpoint dir | bundled | random")
    parser.add_argument("--tokenizer", default=None, help="tokenizer dir for --model random")
    parser.add_argument("--batch", type=int, default=2, help="B: prompts per step")
    parser.add_argument("--group", type=int, default=4, help="G: completions per prompt")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--completion-len", type=int, default=48)
    parser.add_argument("--steps", type=int, default=2, help="measured steps (median reported)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient (0: no reference pass)")
    parser.add_argument("--full", dest="lora", action="store_false", help="full fine-tuning instead of LoRA")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute activations in backward on both sides (TRL's own default is on)")
    parser.add_argument("--full-logits", action="store_true", help="ours: the model's own forward makes every "
                        "row's logits at once (before: how the update peaked 1.5x TRL's memory)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="/tmp/train_vs_trl")
    parser.add_argument("--only", choices=["ours", "trl"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    path = resolve_model(args)
    if args.only:
        result = run_ours(args, path) if args.only == "ours" else run_trl(args, path)
        print("RESULT " + json.dumps(result))
        return
    results = {}
    for side in ("ours", "trl"):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--only", side]
        if args.model == "random":
            cmd += ["--model", path]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        results[side] = json.loads(line[7:]) if line else {"error": proc.stderr[-2000:]}
    ours, trl = results["ours"].get("update_tokens_per_s"), results["trl"].get("update_tokens_per_s")
    summary = {"device": args.device, "model": args.model, "lora": args.lora, "batch": args.batch,
               "group": args.group, "prompt_len": args.prompt_len, "completion_len": args.completion_len,
               "beta": args.beta, "steps": args.steps, "gradient_checkpointing": args.gradient_checkpointing,
               **results,
               "update_speedup_vs_trl": round(ours / trl, 2) if ours and trl else None}
    if args.device.startswith("cuda"):
        summary["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

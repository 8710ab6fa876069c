"""One real verl training step on one GPU: vLLM rollouts of a tiny random model, FSDP update, checkpoint,
conversion. Needs CUDA, the `[verl]` extra and vLLM (`pip install 'verl[vllm]==0.9.1'`); skipped otherwise.

The model is made here (random weights, the in-memory tokenizer), the frozen roles sit behind a fake
OpenAI-compatible HTTP server: nothing is downloaded. A few minutes on one GPU.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("verl") is None or importlib.util.find_spec("vllm") is None,
                       reason="needs the [verl] extra and vLLM"),
]


def test_one_training_step_writes_a_checkpoint_that_converts(tmp_path: Path) -> None:
    import yaml
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentflow.verl.convert import convert_checkpoint
    from agentflow.verl.launch import launch
    from tests.servers import fake_openai_server, reply
    from tests.verl.fakes import tiny_hf_tokenizer

    model_dir = tmp_path / "planner"
    tokenizer = tiny_hf_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": 2 * i,
                                             "reward": "math"}) + "\n" for i in range(4)))

    with fake_openai_server(reply('{"query": "x", "analysis": "a", "conclusion": "STOP"}')) as frozen:
        raw = {
            "flow": {
                "engines": {"policy": {"kind": "transformers", "model": str(model_dir)},
                            "frozen": {"kind": "openai", "model": "m", "base_url": frozen.base_url,
                                       "api_key_env": None}},
                "roles": {"planner": {"engine": "policy", "sampling": {"temperature": 1.0, "max_tokens": 32}},
                          "executor": {"engine": "frozen"}, "verifier": {"engine": "frozen"},
                          "generator": {"engine": "frozen"}, "tools": {"engine": "frozen"}},
                "tools": {"base_generator": {}}, "limits": {"max_turns": 2}, "query_analysis": False},
            "data": {"train_path": str(questions), "eval_path": str(questions)},
            "lora": {"enabled": False}, "batch_size": 2, "group_size": 2, "max_steps": 1, "save_every": 1,
            "eval_at_start": False, "eval_every": 0, "micro_batch_tokens": 4096,
            "output_dir": str(tmp_path / "run"),
            "verl": {"nnodes": 1, "n_gpus_per_node": 1, "gpu_memory_utilization": 0.3,
                     "max_prompt_length": 2048, "agent_workers": 1, "loggers": ["console"],
                     "overrides": ["actor_rollout_ref.rollout.enforce_eager=true"]},
        }
        (tmp_path / "train_verl.yaml").write_text(yaml.safe_dump(raw))
        launch(tmp_path / "train_verl.yaml")

    run = tmp_path / "run"
    assert (run / "checkpoints" / "global_step_1" / "actor").is_dir()
    summaries = [json.loads(line) for f in (run / "trajectories").glob("*.jsonl")
                 for line in f.read_text().splitlines()]
    assert len([s for s in summaries if s["excluded"] is None]) >= 4
    converted = convert_checkpoint(run, tmp_path / "converted")
    assert (converted.model_dir / "config.json").is_file()

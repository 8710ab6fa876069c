"""Exported planner: the merged HF checkpoint and the GGUF both reproduce the trained model's outputs."""

import numpy as np
import pytest
import torch

from agentflow.train.export import gguf_name, rotary_permute


def test_gguf_names_follow_llama_cpp():
    assert gguf_name("model.embed_tokens.weight") == "token_embd.weight"
    assert gguf_name("model.layers.7.self_attn.q_proj.weight") == "blk.7.attn_q.weight"
    assert gguf_name("model.layers.0.mlp.down_proj.weight") == "blk.0.ffn_down.weight"
    assert gguf_name("model.layers.3.post_attention_layernorm.weight") == "blk.3.ffn_norm.weight"
    assert gguf_name("model.rotary_emb.inv_freq") is None


def test_rotary_permute_interleaves_the_two_halves_of_each_head():
    # one head of dim 4: rows [a0, a1, b0, b1] (HF: first half, second half) -> [a0, b0, a1, b1]
    w = np.arange(8, dtype=np.float32).reshape(4, 2)
    out = rotary_permute(w, n_head=1)
    assert out[:, 0].tolist() == [0, 4, 2, 6]


@pytest.mark.slow
def test_exported_planner_matches_the_trained_model(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agentflow.engines.hf import load_policy
    from agentflow.train.export import export_planner

    torch.manual_seed(0)
    model, tokenizer = load_policy()
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
    with torch.no_grad():  # a "trained" adapter: LoRA B is zero at initialisation
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        expected = model(input_ids=ids).logits[0, -1]
    out = export_planner(model, tokenizer, tmp_path, lora=True, gguf=True)
    assert (out / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out / "model")
    from_gguf = AutoModelForCausalLM.from_pretrained(out, gguf_file="planner.gguf")
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits[0, -1], expected, atol=1e-3)
        gguf_logits = from_gguf(input_ids=ids).logits[0, -1]
    # Q8_0 quantisation: close, same top tokens (a wrong rotary layout would scramble them)
    assert torch.corrcoef(torch.stack([gguf_logits, expected]))[0, 1] > 0.99
    assert gguf_logits.topk(5).indices.tolist()[:2] == expected.topk(5).indices.tolist()[:2]

    # and llama.cpp, the engine the GGUF is for, serves it
    import asyncio

    from agentflow.config import LlamaCppEngineConfig
    from agentflow.engines.base import SamplingParams
    from agentflow.engines.llamacpp import LlamaCppEngine

    async def generate() -> str:
        engine = LlamaCppEngine(LlamaCppEngineConfig(model_path=str(out / "planner.gguf"), n_threads=1,
                                                     n_parallel=1, n_ctx=512))
        try:
            completion = await engine.generate([{"role": "user", "content": "Name a colour."}],
                                               SamplingParams(max_tokens=8))
        finally:
            await engine.aclose()
        return completion.text

    assert asyncio.run(generate()).strip()

"""verl checkpoint -> Hugging Face directory: checkpoint layouts built on disk as verl writes them.

The shard-merging route uses verl's own `FSDPModelMerger` and runs where verl is installed; the copy route
(full weights saved by verl under `huggingface/`) and the directory resolution run everywhere.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from agentflow.errors import ConfigError
from agentflow.verl.convert import convert_checkpoint, resolve_actor_dir
from tests.verl.fakes import tiny_hf_tokenizer

HAS_VERL = importlib.util.find_spec("verl") is not None


def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=260, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def actor_dir(run: Path, step: int) -> Path:
    path = run / "checkpoints" / f"global_step_{step}" / "actor"
    (path / "huggingface").mkdir(parents=True)
    return path


def save_config_and_tokenizer(model, actor: Path) -> None:
    """What verl always writes to actor/huggingface: the model config (of a pretrained checkpoint, so it names
    its architecture) and the tokenizer."""
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(actor / "huggingface")
    tiny_hf_tokenizer().save_pretrained(actor / "huggingface")


def mark_latest(run: Path, step: int) -> None:
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(step))


def logits(model_dir: Path, adapter: Path | None = None) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    with torch.no_grad():
        return model(torch.tensor([[1, 2, 3, 4]])).logits


def test_run_directory_resolves_to_the_newest_checkpoint(tmp_path: Path) -> None:
    for step in (10, 20):
        actor = actor_dir(tmp_path, step)
        (actor / "fsdp_config.json").write_text(json.dumps({"world_size": 1}))
    mark_latest(tmp_path, 20)
    newest = tmp_path / "checkpoints" / "global_step_20" / "actor"
    assert resolve_actor_dir(tmp_path) == newest
    assert resolve_actor_dir(tmp_path / "checkpoints") == newest
    older = tmp_path / "checkpoints" / "global_step_10"
    assert resolve_actor_dir(older) == older / "actor"
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").unlink()
    assert resolve_actor_dir(tmp_path) == newest  # without the tracker: the highest step
    with pytest.raises(ConfigError, match="no verl checkpoint"):
        resolve_actor_dir(tmp_path / "checkpoints" / "global_step_20" / "actor" / "huggingface")


def test_full_weights_saved_by_verl_are_copied_and_load(tmp_path: Path) -> None:
    model = tiny_model()
    actor = actor_dir(tmp_path / "run", 5)
    model.save_pretrained(actor / "huggingface")
    tiny_hf_tokenizer().save_pretrained(actor / "huggingface")
    mark_latest(tmp_path / "run", 5)

    converted = convert_checkpoint(tmp_path / "run", tmp_path / "planner")
    assert converted.adapter_dir is None and converted.source == actor
    engine = converted.engine_config()
    assert engine.kind == "transformers" and engine.model == str(tmp_path / "planner")
    with torch.no_grad():
        expected = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.allclose(logits(tmp_path / "planner"), expected)


async def test_converted_planner_runs_in_agentflows_transformers_engine(tmp_path: Path) -> None:
    """What `agentflow solve` / `eval` do with it: the transformers engine loads the directory and generates."""
    from agentflow.engines import build_engine
    from agentflow.engines.base import SamplingParams

    actor = actor_dir(tmp_path / "run", 1)
    tiny_model().save_pretrained(actor / "huggingface")
    tiny_hf_tokenizer().save_pretrained(actor / "huggingface")
    converted = convert_checkpoint(tmp_path / "run", tmp_path / "planner")
    engine = build_engine(converted.engine_config())
    try:
        completion = await engine.generate([{"role": "user", "content": "hi"}],
                                           SamplingParams(temperature=0.0, max_tokens=3))
    finally:
        await engine.aclose()
    assert completion.token_ids and len(completion.token_ids) == len(completion.logprobs) <= 3


def test_shards_without_verl_name_the_merger_command(tmp_path: Path) -> None:
    if HAS_VERL:
        pytest.skip("verl is installed: shards are merged (tested below)")
    actor = actor_dir(tmp_path, 1)
    (actor / "model_world_size_1_rank_0.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="verl.model_merger merge --backend fsdp"):
        convert_checkpoint(tmp_path, tmp_path / "out")


@pytest.mark.skipif(not HAS_VERL, reason="merging FSDP shards uses verl's model merger (pip install '.[verl]')")
def test_fsdp_shards_are_merged_by_verls_merger(tmp_path: Path) -> None:
    model = tiny_model()
    actor = actor_dir(tmp_path, 3)
    save_config_and_tokenizer(model, actor)
    torch.save(model.state_dict(), actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": 1}))
    mark_latest(tmp_path, 3)

    converted = convert_checkpoint(tmp_path, tmp_path / "planner")
    assert converted.adapter_dir is None
    # verl's merger writes bfloat16 weights: compare with the original model rounded the same way
    model.to(torch.bfloat16).to(torch.float32)
    with torch.no_grad():
        expected = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.allclose(logits(tmp_path / "planner"), expected, atol=1e-5)


@pytest.mark.skipif(not HAS_VERL, reason="merging FSDP shards uses verl's model merger (pip install '.[verl]')")
def test_lora_run_gives_base_model_and_adapter(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    base = tiny_model()
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    actor = actor_dir(tmp_path, 2)
    save_config_and_tokenizer(base, actor)
    torch.save(peft_model.state_dict(), actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": 1}))
    (actor / "lora_train_meta.json").write_text(json.dumps({"r": 4, "lora_alpha": 8, "task_type": "CAUSAL_LM"}))

    converted = convert_checkpoint(tmp_path / "checkpoints" / "global_step_2", tmp_path / "planner")
    assert converted.adapter_dir == tmp_path / "planner" / "lora_adapter"
    assert converted.engine_config().adapter == str(converted.adapter_dir)
    peft_model.to(torch.bfloat16).to(torch.float32)
    with torch.no_grad():
        expected = peft_model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.allclose(logits(tmp_path / "planner", converted.adapter_dir), expected, atol=1e-4)

"""Save the trained planner where `agentflow solve` / `eval` load it, and as GGUF for llama.cpp.

- `DIR/adapter/`: the PEFT adapter (with LoRA): `TransformersEngineConfig(model=<base>, adapter=DIR/adapter)`.
- `DIR/model/`: the merged Hugging Face checkpoint (safetensors): `TransformersEngineConfig(model=DIR/model)`.
- `DIR/planner.gguf`: llama.cpp's format: `LlamaCppEngineConfig(model_path=DIR/planner.gguf)`.
- `write_lora_gguf`: the adapter alone as a llama.cpp LoRA file, which the rollout engine loads over the base
  after every optimiser step (`train/engine_rollout.py`): kilobytes to megabytes instead of the whole model.

GGUF route: transformers can read GGUF but not write it, and llama.cpp's converter script is not on PyPI.
The `gguf` package's writer is, so we copy the base GGUF's metadata (architecture, tokenizer, chat template)
and write the merged weights under llama.cpp's tensor names, Q8_0 for matrices and F32 for norms. Llama
q/k projections are stored by llama.cpp in an interleaved rotary layout; we apply the same permutation that
its converter applies (transformers' GGUF loader undoes it on load). Works for llama-architecture bases
given as GGUF (the bundled SmolLM2 is one); other bases get the HF directory and a logged reason.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf_name: str) -> str | None:
    """llama.cpp tensor name of a LlamaForCausalLM parameter (None for ones GGUF does not store)."""
    name = hf_name.removesuffix(".weight")
    if name == "model.embed_tokens":
        return "token_embd.weight"
    if name == "model.norm":
        return "output_norm.weight"
    if name == "lm_head":
        return "output.weight"
    parts = name.split(".")
    if len(parts) >= 4 and parts[0] == "model" and parts[1] == "layers":
        mapped = _LAYER_NAMES.get(".".join(parts[3:]))
        if mapped:
            return f"blk.{parts[2]}.{mapped}.weight"
    return None


def rotary_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """HF's half-split rotary layout -> llama.cpp's interleaved layout (rows of a q or k projection)."""
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


#: Matrix formats `write_gguf` writes: Q8_0 (the export; 1.8x faster prompt reading than Q4_1 on CPU) and F16
#: (the rollout engine's base: log-probs within ~0.003 nats of the float32 trainer, Q4_1/Q8_0 ~0.03).
FILE_TYPES = ("q8_0", "f16")


def _llama_template(template: Path) -> tuple[Any, int, int]:
    """`template`'s GGUF reader and its (query, key-value) head counts; refuses non-llama architectures."""
    import gguf

    reader = gguf.GGUFReader(str(template))
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise ValueError(f"GGUF export supports llama-architecture bases; {template} is {arch!r}")
    return (reader, int(reader.fields["llama.attention.head_count"].contents()),
            int(reader.fields["llama.attention.head_count_kv"].contents()))


def write_gguf(state: dict[str, torch.Tensor], *, template: Path, out: Path, file_type: str = "q8_0") -> Path:
    """Write `state` (merged LlamaForCausalLM weights) as GGUF with `template`'s metadata; matrices in
    `file_type` (`FILE_TYPES`), norms in F32."""
    import gguf

    if file_type not in FILE_TYPES:
        raise ValueError(f"unknown GGUF file type {file_type!r}; known: {', '.join(FILE_TYPES)}")
    reader, n_head, n_head_kv = _llama_template(template)
    wanted = {t.name for t in reader.tensors}
    writer = gguf.GGUFWriter(str(out), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if file_type == "q8_0" else gguf.LlamaFileType.MOSTLY_F16)
    written = set()
    for hf_name, tensor in state.items():
        name = gguf_name(hf_name)
        if name is None or name not in wanted:
            continue
        data = tensor.detach().to(torch.float32).cpu().numpy()
        if name.endswith("attn_q.weight"):
            data = rotary_permute(data, n_head)
        elif name.endswith("attn_k.weight"):
            data = rotary_permute(data, n_head_kv)
        if data.ndim == 2 and file_type == "f16":
            writer.add_tensor(name, data.astype(np.float16))
        elif data.ndim == 2 and data.shape[1] % 32 == 0:
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
        written.add(name)
    missing = wanted - written
    if missing:
        raise ValueError(f"GGUF export: no weights for {sorted(missing)[:5]}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_lora_gguf(model: torch.nn.Module, *, template: Path, out: Path, adapter: str = "default") -> int:
    """Write the PEFT LoRA adapter `adapter` of `model` (on a llama base given as the GGUF `template`) as a
    llama.cpp LoRA file; returns its size in bytes (`_write_lora`)."""
    if adapter not in model.peft_config:
        raise ValueError(f"the model has no LoRA adapter {adapter!r} (it has {sorted(model.peft_config)})")
    state = {name.replace(f".{adapter}.", "."): tensor for name, tensor in model.state_dict().items()
             if f".lora_A.{adapter}." in name or f".lora_B.{adapter}." in name}
    return _write_lora(state, alpha=float(model.peft_config[adapter].lora_alpha), template=template, out=out)


def adapter_lora_gguf(adapter_dir: Path, *, template: Path, root: Path | None = None) -> Path:
    """A saved PEFT LoRA adapter (a folder with adapter_config.json and adapter_model.safetensors, over the
    llama base `template`) as a llama.cpp LoRA file, written on first use and cached (keyed by the adapter's
    and the template's contents): what a llama.cpp engine with `adapter:` loads."""
    import hashlib
    import os
    import tempfile

    from safetensors.torch import load_file

    from agentflow.bundled import cache_dir

    weights, settings = adapter_dir / "adapter_model.safetensors", adapter_dir / "adapter_config.json"
    if not weights.is_file():
        raise ValueError(f"{adapter_dir}: no adapter_model.safetensors (a PEFT LoRA adapter folder is expected)")
    config = json.loads(settings.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{adapter_dir}: a {config.get('peft_type')} adapter; llama.cpp loads LoRA adapters only")
    digest = hashlib.sha256(weights.read_bytes() + settings.read_bytes())
    stat = template.stat()
    digest.update(f"{template.name}-{stat.st_size}".encode())
    root = root or cache_dir() / "gguf-lora"
    target = root / f"{adapter_dir.name}-{digest.hexdigest()[:16]}.gguf"
    if target.is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.to(torch.float32) for name, tensor in load_file(str(weights)).items()}
    handle, staging = tempfile.mkstemp(prefix=f".{target.name}-", dir=root)
    os.close(handle)
    try:
        _write_lora(state, alpha=float(config["lora_alpha"]), template=template, out=Path(staging))
        Path(staging).chmod(0o644)
        os.replace(staging, target)
    finally:
        Path(staging).unlink(missing_ok=True)
    log.info("wrote the adapter %s as a llama.cpp LoRA file (cached at %s)", adapter_dir, target)
    return target


def _write_lora(state: dict[str, torch.Tensor], *, alpha: float, template: Path, out: Path) -> int:
    """LoRA matrices named as PEFT saves them (`base_model.model.<parameter>.lora_A.weight`, `...lora_B...`)
    as a llama.cpp LoRA file; returns its size in bytes.

    llama.cpp adds scale * alpha / rank * B (A x) to each adapted matrix, A stored (rank, in) and B (out,
    rank) under the base tensor's name + `.lora_a` / `.lora_b`. B of q and k projections gets the same row
    permutation as their base matrices (`rotary_permute`). F32 throughout: the adapter is small."""
    import gguf

    _, n_head, n_head_kv = _llama_template(template)
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    adapted = 0
    for name, a in state.items():
        if ".lora_A." not in name:
            continue
        base = name.removeprefix("base_model.model.").replace(".lora_A", "")
        target = gguf_name(base)
        if target is None:
            raise ValueError(f"LoRA on {base!r}: llama.cpp has no tensor for it")
        b = state[name.replace(".lora_A.", ".lora_B.")].detach().to(torch.float32).cpu().numpy()
        if target.endswith("attn_q.weight"):
            b = rotary_permute(b, n_head)
        elif target.endswith("attn_k.weight"):
            b = rotary_permute(b, n_head_kv)
        writer.add_tensor(f"{target}.lora_a", np.ascontiguousarray(a.detach().to(torch.float32).cpu().numpy()))
        writer.add_tensor(f"{target}.lora_b", np.ascontiguousarray(b))
        adapted += 1
    if not adapted:
        raise ValueError("the model has no LoRA adapter to write")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out.stat().st_size


def requantized_q8_0(gguf_path: Path, *, root: Path | None = None) -> Path:
    """`gguf_path` re-written as Q8_0 (`converted_gguf`)."""
    return converted_gguf(gguf_path, "q8_0", root=root)


def converted_gguf(gguf_path: Path, file_type: str, *, root: Path | None = None) -> Path:
    """`gguf_path` re-written with `file_type` matrices, created on first use and cached (keyed like
    `gguf_checkpoint`).

    The weights go through the cached transformers conversion (dequantised) and `write_gguf`; the file is
    written under a temporary name and renamed, so concurrent processes never load half of it."""
    import os
    import tempfile

    from safetensors.torch import load_file

    from agentflow.bundled import cache_dir
    from agentflow.engines.hf import gguf_checkpoint

    stat = gguf_path.stat()
    root = root or cache_dir() / f"gguf-{file_type}"
    target = root / f"{gguf_path.stem}-{stat.st_size}-{stat.st_mtime_ns}.{file_type}.gguf"
    if target.is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    state = load_file(str(gguf_checkpoint(gguf_path) / "model.safetensors"))
    handle, staging = tempfile.mkstemp(prefix=f".{target.name}-", dir=root)
    os.close(handle)
    try:
        write_gguf(state, template=gguf_path, out=Path(staging), file_type=file_type)
        Path(staging).chmod(0o644)
        os.replace(staging, target)
    finally:
        Path(staging).unlink(missing_ok=True)
    log.info("re-wrote %s as %s (cached at %s)", gguf_path.name, file_type.upper(), target)
    return target


def export_planner(model: torch.nn.Module, tokenizer, out_dir: Path, *, lora: bool, gguf: bool,
                   gguf_template: Path | None = None, adapter: str | None = None,
                   gguf_file: str = "planner.gguf") -> Path:
    """Save adapter (LoRA) and merged model; write GGUF when asked and possible. Returns out_dir.

    `adapter`: of a model holding one adapter per role, the one to export (saved as a plain PEFT adapter that
    `adapter:` loads, merged alone into the model); None: the model's only adapter."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if lora and hasattr(model, "peft_config"):
        if adapter is None:
            model.save_pretrained(str(out_dir / "adapter"))
        else:
            save_one_adapter(model, adapter, out_dir / "adapter")
        merged = _merged_copy(model, adapter)
    else:
        merged = model
    _forget_gguf_origin(merged)
    merged.save_pretrained(str(out_dir / "model"))
    tokenizer.save_pretrained(str(out_dir / "model"))
    if gguf:
        from agentflow.bundled import bundled_model_path

        template = gguf_template or bundled_model_path()
        try:
            state = dict(merged.state_dict())
            write_gguf(state, template=template, out=out_dir / gguf_file)
        except ValueError as err:
            log.warning("GGUF export skipped: %s", err)
    return out_dir


def _merged_copy(model: torch.nn.Module, adapter: str | None = None) -> torch.nn.Module:
    """The base model with the adapter (`adapter`, of several) merged in, leaving `model` (still training)
    untouched."""
    copied = copy.deepcopy(model)
    if adapter is None:
        return copied.merge_and_unload()
    return copied.merge_and_unload(adapter_names=[adapter])


def save_one_adapter(model: torch.nn.Module, adapter: str, out: Path) -> None:
    """One adapter of several, in PEFT's folder layout (adapter_config.json, adapter_model.safetensors) under
    `out` itself: PEFT's own `save_pretrained` puts any adapter but `default` in a sub-folder named after it."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(model, adapter_name=adapter)
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(out / "adapter_model.safetensors"))
    config = copy.deepcopy(model.peft_config[adapter])  # as PEFT saves: for inference, the live one untouched
    config.inference_mode = True
    config.save_pretrained(str(out))


def _forget_gguf_origin(model: torch.nn.Module) -> None:
    """A model loaded from GGUF is dequantised to float weights, but transformers still marks it as
    GGUF-quantised and refuses `save_pretrained`; the marks are stale, so drop them."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

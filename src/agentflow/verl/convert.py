"""A verl checkpoint -> a Hugging Face directory that `agentflow solve` / `agentflow eval` load.

verl (FSDP engine) saves each checkpoint as `DIR/checkpoints/global_step_N/actor/`: one
`model_world_size_W_rank_R.pt` shard per GPU, `fsdp_config.json`, and `huggingface/` holding the model
config and tokenizer (and full weights only when `actor.checkpoint.save_contents` includes `hf_model`).
`latest_checkpointed_iteration.txt` names the newest step.

`convert_checkpoint(path, out)` accepts the run directory, the checkpoints directory, a `global_step_N`
directory or an `actor` directory. Full weights in `huggingface/` are copied; shards are merged by verl's own
`FSDPModelMerger` (the library behind `python -m verl.model_merger merge --backend fsdp`), so this needs
verl installed, as on the machine that trained. A LoRA run gives the base model plus `lora_adapter/`:

    engines:
      policy: {kind: transformers, model: OUT, adapter: OUT/lora_adapter}
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from agentflow.config import TransformersEngineConfig
from agentflow.errors import ConfigError

log = logging.getLogger(__name__)

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
SHARD = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt$")


@dataclass
class ConvertedPlanner:
    """Where the converted planner is, and the engine config that loads it."""

    model_dir: Path
    adapter_dir: Path | None
    source: Path

    def engine_config(self) -> TransformersEngineConfig:
        return TransformersEngineConfig(model=str(self.model_dir),
                                        adapter=str(self.adapter_dir) if self.adapter_dir else None)


def _has_weights(directory: Path) -> bool:
    return directory.is_dir() and any(any(directory.glob(p)) for p in WEIGHT_PATTERNS)


def _is_actor_dir(directory: Path) -> bool:
    return (directory / "fsdp_config.json").is_file() or any(SHARD.search(p.name) for p in directory.glob("*.pt")) \
        or _has_weights(directory / "huggingface")


def _latest_step_dir(root: Path) -> Path | None:
    tracker = root / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        step_dir = root / f"global_step_{tracker.read_text().strip()}"
        if step_dir.is_dir():
            return step_dir
    steps = sorted((int(m.group(1)), p) for p in root.glob("global_step_*")
                   if p.is_dir() and (m := re.fullmatch(r"global_step_(\d+)", p.name)))
    return steps[-1][1] if steps else None


def resolve_actor_dir(path: str | Path) -> Path:
    """The `actor` checkpoint directory that `path` designates (the newest step for a run directory)."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"checkpoint not found: {path}")
    if _is_actor_dir(path):
        return path
    if (path / "actor").is_dir():
        return path / "actor"
    for root in (path, path / "checkpoints"):
        step_dir = _latest_step_dir(root) if root.is_dir() else None
        if step_dir is not None and (step_dir / "actor").is_dir():
            return step_dir / "actor"
    raise ConfigError(f"no verl checkpoint under {path} (expected global_step_N/actor/ with FSDP shards)")


def convert_checkpoint(path: str | Path, out: str | Path) -> ConvertedPlanner:
    """Write a loadable Hugging Face directory (and `lora_adapter/` for LoRA runs) to `out`."""
    actor = resolve_actor_dir(path)
    out = Path(out)
    hf_dir = actor / "huggingface"
    if _has_weights(hf_dir):
        log.info("copying the full Hugging Face model saved by verl from %s", hf_dir)
        shutil.copytree(hf_dir, out, dirs_exist_ok=True)
    elif any(SHARD.search(p.name) for p in actor.glob("*.pt")):
        _merge_fsdp_shards(actor, out)
    else:
        raise ConfigError(f"{actor}: neither FSDP shards nor Hugging Face weights to convert")
    adapter = out / "lora_adapter"
    return ConvertedPlanner(model_dir=out, adapter_dir=adapter if adapter.is_dir() else None, source=actor)


def _merge_fsdp_shards(actor: Path, out: Path) -> None:
    try:
        from verl.model_merger.base_model_merger import ModelMergerConfig
        from verl.model_merger.fsdp_model_merger import FSDPModelMerger
    except ImportError:
        raise ConfigError(
            f"merging FSDP shards needs verl (pip install 'agentflow[verl]'), or run on the training machine: "
            f"python -m verl.model_merger merge --backend fsdp --local_dir {actor} --target_dir {out}") from None
    config = ModelMergerConfig(operation="merge", backend="fsdp", local_dir=str(actor), target_dir=str(out),
                               hf_model_config_path=str(actor / "huggingface"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # verl's merger reports with print()
        merger = FSDPModelMerger(config)
        merger.merge_and_save()
        merger.cleanup()
    for line in printed.getvalue().splitlines():
        log.info("verl model_merger: %s", line)

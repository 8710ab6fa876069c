"""Checkpoints that a killed run resumes from exactly.

A checkpoint directory holds the trainable weights (the LoRA adapter, or the full model; with one adapter per
trained role, every role's), the optimiser and scheduler states (`optimizer.pt`, and `optimizer-ROLE.pt` for
each further role's own), the RNG states (python, numpy, torch, CUDA, and the policy engine's own sampling stream)
and `state.json` (step, data position).
It is written to `step-NNNNNN.tmp` and renamed into place, so a kill mid-write leaves the previous
checkpoint as the latest complete one.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

STATE_FILE = "state.json"


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: torch.nn.Module, names: set[str] | None = None) -> dict[str, torch.Tensor]:
    """The parameters that training changes: `names`, or those that require gradients (the adapter with
    LoRA, everything without). With one adapter per role only the active one requires gradients: pass names."""
    return {name: p.detach().cpu().clone() for name, p in model.named_parameters()
            if (name in names if names is not None else p.requires_grad)}


def save_checkpoint(root: Path, *, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, state: dict[str, Any], keep: int,
                    sampling_state: dict[str, torch.Tensor] | None = None, trainable: set[str] | None = None,
                    roles: dict[str, tuple[torch.optim.Optimizer, Any]] | None = None) -> Path:
    """Write checkpoint `root/step-NNNNNN` atomically; delete all but the newest `keep`. `trainable`: the
    names of the parameters to save (default: those requiring gradients); `roles`: further trained roles'
    own optimiser and scheduler, by role."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f"step-{step:06d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    torch.save(trainable_state(model, trainable), tmp / "trainable.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    for role, (role_optimizer, role_scheduler) in (roles or {}).items():
        torch.save(role_optimizer.state_dict(), tmp / f"optimizer-{role}.pt")
        torch.save(role_scheduler.state_dict(), tmp / f"scheduler-{role}.pt")
    torch.save({**rng_state(), "policy_sampling": sampling_state}, tmp / "rng.pt")
    (tmp / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=2))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint written: %s", final)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first (unfinished `.tmp` directories are ignored)."""
    if not root.is_dir():
        return []
    done = [p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp")
            and (p / STATE_FILE).is_file()]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def load_checkpoint(path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, roles: dict[str, tuple[torch.optim.Optimizer, Any]] | None = None
                    ) -> dict[str, Any]:
    """Restore weights, optimisers, schedulers and RNG from `path`; return its state.json, plus the policy
    engine's sampling stream under `policy_sampling` (None in checkpoints written before it was saved)."""
    absent = [role for role in roles or {} if not (path / f"optimizer-{role}.pt").is_file()]
    if absent:
        raise ValueError(f"checkpoint {path} has no optimiser state of the trained role(s) {absent}: it was "
                         "written by a run that trained other roles")
    weights = torch.load(path / "trainable.pt", map_location="cpu", weights_only=True)
    params = dict(model.named_parameters())
    missing = [name for name in weights if name not in params]
    if missing:
        raise ValueError(f"checkpoint {path} has parameters the model lacks: {missing[:3]}")
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=False))
    for role, (role_optimizer, role_scheduler) in (roles or {}).items():
        role_optimizer.load_state_dict(torch.load(path / f"optimizer-{role}.pt", map_location="cpu",
                                                  weights_only=False))
        role_scheduler.load_state_dict(torch.load(path / f"scheduler-{role}.pt", map_location="cpu",
                                                  weights_only=False))
    rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=False)
    set_rng_state(rng)
    return {**json.loads((path / STATE_FILE).read_text()), "policy_sampling": rng.get("policy_sampling")}

"""Checkpoints: weights, optimiser, scheduler and RNG round-trip; incomplete ones are ignored; old pruned."""

import random

import numpy as np
import torch

from agentflow.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint


def make():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
    return model, optimizer, scheduler


def step(model, optimizer, scheduler):
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def test_round_trip_restores_training_state_and_random_streams(tmp_path):
    torch.manual_seed(0)
    model, optimizer, scheduler = make()
    step(model, optimizer, scheduler)
    random.seed(3)
    np.random.seed(3)
    stream = {"cpu": torch.Generator().manual_seed(7).get_state()}
    save_checkpoint(tmp_path, step=1, model=model, optimizer=optimizer, scheduler=scheduler,
                    state={"data_position": 8}, keep=2, sampling_state=stream)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    step(model, optimizer, scheduler)
    after_two = model.weight.detach().clone()

    fresh, fresh_opt, fresh_sched = make()
    state = load_checkpoint(list_checkpoints(tmp_path)[-1], model=fresh, optimizer=fresh_opt,
                            scheduler=fresh_sched)
    restored = state.pop("policy_sampling")
    assert state == {"step": 1, "data_position": 8}
    assert torch.equal(restored["cpu"], stream["cpu"])  # the policy engine's sampling stream continues
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    step(fresh, fresh_opt, fresh_sched)
    assert torch.allclose(fresh.weight, after_two)
    assert fresh_sched.get_last_lr() == scheduler.get_last_lr()


def test_unfinished_checkpoints_are_ignored_and_old_ones_pruned(tmp_path):
    model, optimizer, scheduler = make()
    for s in (1, 2, 3):
        save_checkpoint(tmp_path, step=s, model=model, optimizer=optimizer, scheduler=scheduler,
                        state={"data_position": s}, keep=2)
    (tmp_path / "step-000004.tmp").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002", "step-000003"]

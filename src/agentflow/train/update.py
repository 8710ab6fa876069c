"""The policy update of Flow-GRPO: reference log-probs, then `ppo_epochs` passes over mini-batches of
questions, each pass one optimiser step per mini-batch, its gradient accumulated over micro-batches.

A mini-batch holds whole questions (all their trajectories and every planner turn of those), so the paper's
normalisation 1/G * 1/T_i * 1/|a| is well defined in it. Row weights (`losses.row_weights`) are computed over
the whole mini-batch before rows that carry no gradient are skipped, so a step with few informative groups is
not scaled up. The "old" log-probs are those the rollout recorded: the first update of a batch starts at
ratio 1, later updates (second mini-batch, second epoch) move away from it, and the clip acts there.

Rows sampled by another engine (llama.cpp, `engine_rollout.py`) carry that engine's raw log-probs instead.
The trainer then recomputes the old log-probs itself (one forward pass without gradient, same weights as the
rollout), so the PPO ratio compares the trainer's distributions only, and measures the gap: per token,
delta = trainer's raw log-prob - engine's raw log-prob of the same id. Truncated importance sampling (TIS;
Yao et al. 2025, as in verl and TRL) weighs each token's clipped term by min(exp(delta / T), C): the engine's
log-prob under the grammar mask and temperature is estimated with the trainer's normaliser, exact when the
two agree on the mass of the allowed tokens and first-order otherwise.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch

from agentflow.train.config import TrainConfig
from agentflow.train.logprobs import (
    SharedPrefix,
    action_choices,
    action_index,
    action_positions,
    action_tokens,
    free_positions,
    micro_batches,
    pack_rows,
    prefix_sharing_exact,
    response_logprobs,
)
from agentflow.train.losses import action_credit, clipped_surrogate_loss, row_weights
from agentflow.train.rollout import TurnRow


@dataclass
class UpdateBatch:
    """The rows of one rollout batch, with what the update needs to weigh them."""

    rows: list[TurnRow]
    advantages: torch.Tensor
    """(rows,) advantage of each planner-turn row."""
    row_group: list[str]
    """Question id of each row."""
    trajectories: dict[str, int]
    """Scored trajectories of each question (G, less those excluded for infrastructure failures)."""


def mini_batch_groups(groups: list[str], size: int | None, *, seed: str) -> list[list[str]]:
    """Questions split into mini-batches of `size` (None: one mini-batch), in an order fixed by `seed`."""
    order = list(groups)
    random.Random(seed).shuffle(order)
    size = size or len(order) or 1
    return [order[i:i + size] for i in range(0, len(order), size)]


def _has_action(row: TurnRow) -> bool:
    """Whether the row has an action position (`logprobs.action_positions`): its action token, or else a token
    that was not forced."""
    if row.action is not None:
        return row.action >= 0
    if row.allowed is None:
        return bool(row.response_ids)
    return bool((row.allowed.sum(-1) > 1).any())


def cut_after_action(row: TurnRow) -> TurnRow:
    """`row` up to its action token (a copy), everything its loss sees when the action carries the whole weight;
    the row itself when its action index is unknown or it has none."""
    if row.action is None or row.action < 0:
        return row
    cut = row.action + 1

    def head(values: list[float] | None) -> list[float] | None:
        return None if values is None else values[:cut]

    return replace(row, response_ids=row.response_ids[:cut], old_logprobs=row.old_logprobs[:cut],
                   allowed=None if row.allowed is None else row.allowed[:cut],
                   engine_logprobs=head(row.engine_logprobs), tis_weights=head(row.tis_weights))


@dataclass
class BonusProbe:
    """Rows whose only loss term is the action entropy bonus (advantage 0, no KL), as one row to compute."""

    row: TurnRow
    """Cut after its action (the bonus reads the logits there alone), or whole when its action index is unknown."""
    count: int
    """How many of the update's rows it stands for: they agree up to the action, so their bonus terms are equal."""


def bonus_probes(rows: list[TurnRow]) -> list[BonusProbe]:
    """The bonus-only rows as few, short rows. A row's action entropy depends on its prompt and response up to the
    action, so each row is cut after it, and rows that agree up to there are computed once and counted: a group's
    first turns share their prompt, and under the tool-first schema the reply's opening is forced, so a group
    without signal costs one short row at its first turn instead of G whole ones. The gradient is the same."""
    probes: dict[Any, BonusProbe] = {}
    for row in rows:
        if not _has_action(row):
            continue  # no action: the bonus does not see it
        if row.action is None:
            key: Any = id(row)  # the action is found from the masks when packed: keep the row whole
            probe = row
        else:
            probe = replace(cut_after_action(row), engine_logprobs=None, tis_weights=None)
            key = (row.role, tuple(row.prompt_ids), tuple(probe.response_ids),
                   tuple(map(tuple, row.action_choices or ())))
        if key in probes:
            probes[key].count += 1
        else:
            probes[key] = BonusProbe(probe, 1)
    return list(probes.values())


def _right_aligned(values: list[torch.Tensor], width: int) -> torch.Tensor:
    """(rows, width) tensor of per-row values placed at the right end, as `pack_rows` places responses."""
    out = torch.zeros((len(values), width), dtype=values[0].dtype)
    for i, v in enumerate(values):
        out[i, width - v.shape[0]:] = v
    return out


class PolicyUpdater:
    """Runs the update of one step on the trainer's model, optimiser and policy engine."""

    def __init__(self, config: TrainConfig, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 policy: Any, pad_id: int, ref_model: torch.nn.Module | None, chunked_head: bool,
                 adapter: str | None = None, max_grad_norm: float | None = None) -> None:
        """`adapter`: the LoRA adapter this updater trains, made the model's active (and only trainable) one
        before each update (one updater per trained role); None: the model as it is."""
        self.config = config
        self.model = model
        self.optimizer = optimizer
        self.adapter = adapter
        self.max_grad_norm = max_grad_norm or config.max_grad_norm
        self.policy = policy
        self.pad_id = pad_id
        self.ref_model = ref_model
        self.chunked_head = chunked_head
        self.entropy_coef = config.action_entropy_coef  # the bonus's weight (adapted under action_entropy_target)
        # a layer recomputed under activation checkpointing would add the shared prefix's keys to its cache twice
        self.share_prefix = config.share_prompt_prefix and not config.gradient_checkpointing and \
            prefix_sharing_exact(model)
        # with the whole weight on the action (in the policy term and, by the same credit, the KL term), a reply's
        # tokens after its action carry no gradient: the update cuts each row there (the step is the whole rows')
        self.cut_after_action = config.action_loss_share == 1.0
        self.device = next(model.parameters()).device
        self.vocab_size = model.get_output_embeddings().weight.shape[0]

    def _activate(self) -> None:
        if self.adapter is not None:
            self.model.set_adapter(self.adapter)  # PEFT: only this adapter computes and takes gradients

    def _pack(self, rows: list[TurnRow], prefix: SharedPrefix | None = None) -> Any:
        return pack_rows(rows, pad_id=self.pad_id, device=self.device, allowed=[r.allowed for r in rows],
                         vocab_size=self.vocab_size, prefix=prefix.length if prefix else 0)

    def _micro_batches(self, rows: list[TurnRow], prefix: int = 0) -> list[list[int]]:
        return micro_batches(rows, max_rows=self.config.micro_batch_rows, max_tokens=self.config.micro_batch_tokens,
                             prefix=prefix)

    def replay_masks(self, rows: list[TurnRow]) -> None:
        """Rebuild each constrained row's token masks (what the rollout could draw from) from its schema, and
        find its action (`TurnRow.action`) and, with `action_logprob: tool`, the tokens that start the same tool
        (`TurnRow.action_tokens`) and those that start each tool (`TurnRow.action_choices`)."""
        decode = self.policy.tokenizer.decode
        for row in rows:
            if row.schema is not None and row.allowed is None:
                row.allowed = self.policy.allowed_tokens(row.schema, row.response_ids)
                row.action = action_index(row.response_ids, row.schema, decode)
                if self.config.action_logprob == "tool" and row.action is not None and row.action >= 0:
                    row.action_tokens = action_tokens(row.response_ids, row.action, row.allowed[row.action],
                                                      row.schema, decode)
                    row.action_choices = action_choices(row.allowed[row.action], row.schema, decode)

    def ref_logprobs(self, rows: list[TurnRow], temperature: float,
                     sums: dict[str, float] | None = None) -> list[torch.Tensor]:
        """Log-probs of every row's response tokens under the frozen reference (`ref_model`, else LoRA disabled), once
        per batch: one unpadded (len(response),) tensor per row, since the update groups rows differently; up to
        the action when the update cuts rows there. The rows' shared prompts run once, as in the update
        (`_prefix_passes`); the prompt tokens not forwarded are added to `sums["prefix_tokens_saved"]`."""
        out: list[torch.Tensor | None] = [None] * len(rows)
        if self.cut_after_action:  # as the update will see them
            rows = [cut_after_action(row) for row in rows]
        if self.ref_model is not None:
            model, ctx = self.ref_model, nullcontext()
        else:
            model, ctx = self.model, self.model.disable_adapter()
        with torch.no_grad(), ctx:
            for shared, indices in self._prefix_passes(rows, {} if sums is None else sums, model):
                logprobs, _, _ = response_logprobs(model, self._pack([rows[i] for i in indices], shared),
                                                   temperature=temperature, chunked_head=self.chunked_head,
                                                   prefix=shared)
                for j, i in enumerate(indices):
                    out[i] = logprobs[j, logprobs.shape[1] - len(rows[i].response_ids):]
        return [t for t in out if t is not None]

    def engine_rows(self, rows: list[TurnRow], temperature: float) -> dict[str, float]:
        """Rows sampled by another engine (or with action totals), before an update that moves away from the
        rollout weights (several mini-batches or epochs): one forward pass without gradient gives the trainer's own
        sampling log-probs, which become `old_logprobs`, and the TIS weights; shared prompts run once, as in the
        update. Returns the gap metrics, and the prompt tokens not forwarded."""
        gap = EngineGap(self.config, temperature)
        sums: dict[str, float] = {}
        with torch.no_grad():
            for shared, indices in self._prefix_passes(rows, sums):
                sampled, _, raw = response_logprobs(self.model, self._pack([rows[i] for i in indices], shared),
                                                    temperature=temperature, with_raw=True,
                                                    chunked_head=self.chunked_head, prefix=shared)
                assert raw is not None
                for j, i in enumerate(indices):
                    k = len(rows[i].response_ids)
                    rows[i].old_logprobs = sampled[j, sampled.shape[1] - k:].tolist()
                    rows[i].tis_weights = gap.weights(rows[i], raw[j, raw.shape[1] - k:])
        saved = {"old_logprobs/prefix_tokens_saved": sums["prefix_tokens_saved"]} if sums else {}
        return gap.metrics() | saved

    def grpo(self, batch: UpdateBatch, *, temperature: float, step: int) -> dict[str, float]:
        """`ppo_epochs` x mini-batches optimiser steps over `batch`; metrics token-weighted over all of them."""
        cfg = self.config
        metrics: dict[str, float] = {}
        rows = batch.rows
        self._activate()
        start = time.perf_counter()
        self.replay_masks(rows)
        metrics["seconds/masks"] = time.perf_counter() - start
        groups = list(dict.fromkeys(batch.row_group))
        gap: EngineGap | None = None
        sampled_elsewhere = any(r.engine_logprobs is not None for r in rows)
        if sampled_elsewhere:
            metrics["logprob_gap/mask_disagreements"] = float(unmask_disagreeing_rows(rows))
        # old log-probs from the trainer's own pass: rows another engine sampled, and action totals (the sampler
        # reported the drawn token's log-prob)
        if sampled_elsewhere or any(r.action_tokens for r in rows):
            if cfg.ppo_epochs == 1 and (cfg.ppo_mini_batch_size or len(groups)) >= len(groups):
                # one optimiser step from the rollout's weights: its own forward pass gives the old log-probs
                gap = EngineGap(cfg, temperature)
            else:
                start = time.perf_counter()
                metrics.update(self.engine_rows(rows, temperature))
                metrics["seconds/old_logprobs"] = time.perf_counter() - start
        start = time.perf_counter()
        ref_sums: dict[str, float] = {}
        ref = self.ref_logprobs(rows, temperature, ref_sums) if cfg.kl_coef > 0 and rows else None
        metrics["seconds/ref_logprobs"] = time.perf_counter() - start
        if "prefix_tokens_saved" in ref_sums:
            metrics["ref_logprobs/prefix_tokens_saved"] = ref_sums["prefix_tokens_saved"]

        start = time.perf_counter()
        sums: dict[str, float] = {}
        optimizer_steps, grad_norms, loss_total = 0, [], 0.0
        for epoch in range(cfg.ppo_epochs):
            for chunk in mini_batch_groups(groups, cfg.ppo_mini_batch_size, seed=f"{cfg.seed}/{step}/{epoch}"):
                members = set(chunk)
                indices = [i for i, g in enumerate(batch.row_group) if g in members]
                if not indices:
                    continue
                lengths = torch.tensor([len(rows[i].response_ids) for i in indices])
                trajectory = torch.tensor([rows[i].trajectory for i in indices])
                group_size = torch.tensor([batch.trajectories[batch.row_group[i]] for i in indices])
                weights = row_weights(cfg.loss_aggregation, response_lengths=lengths, row_trajectory=trajectory,
                                      row_group_size=group_size, groups=len(chunk))
                advantages = batch.advantages[indices]
                # rows with zero advantage carry a gradient only through the KL term or the bonus on every row
                keep = list(range(len(indices))) if cfg.kl_coef > 0 else (advantages != 0).nonzero().flatten().tolist()
                probes = bonus_probes([rows[indices[k]] for k in range(len(indices)) if advantages[k] == 0]) \
                    if cfg.kl_coef == 0 and self.entropy_coef > 0 and cfg.action_entropy_rows == "all" else []
                if not keep and not probes:
                    continue
                result = self._optimizer_step(
                    [rows[indices[k]] for k in keep], advantages[keep], weights[keep], temperature,
                    None if ref is None else [ref[indices[k]] for k in keep], sums, gap, probes)
                optimizer_steps += 1
                grad_norms.append(result["grad_norm"])
                loss_total += result["loss"]
                if epoch == cfg.ppo_epochs - 1:
                    sums["clip_last_epoch"] = sums.get("clip_last_epoch", 0.0) + result["clipped_tokens"]
                    sums["tokens_last_epoch"] = sums.get("tokens_last_epoch", 0.0) + result["tokens"]
        seconds = time.perf_counter() - start
        if gap is not None:
            metrics.update(gap.metrics())
        tokens = max(sums.pop("tokens", 0.0), 1.0)
        action_entropy, actions = sums.pop("action_entropy_sum", 0.0), sums.pop("actions", 0.0)
        if actions:
            metrics["action_entropy"] = action_entropy / actions
        if cfg.action_entropy_target is not None:
            metrics["action_entropy_coef"] = self.entropy_coef  # the weight this update used
            if actions:
                below = metrics["action_entropy"] < cfg.action_entropy_target
                self.entropy_coef = max(cfg.action_entropy_coef,
                                        self.entropy_coef + (1 if below else -1) * cfg.action_entropy_coef_step)
        clip_last, tokens_last = sums.pop("clip_last_epoch", 0.0), sums.pop("tokens_last_epoch", 0.0)
        for saved in ("prefix_tokens_saved", "response_tokens_cut"):
            if saved in sums:
                metrics[f"update/{saved}"] = sums.pop(saved)
        metrics.update({k: v / tokens for k, v in sums.items()})
        if tokens_last:
            metrics["clip_fraction_last_epoch"] = clip_last / tokens_last
        metrics.update({
            "loss": loss_total, "optimizer_steps": float(optimizer_steps),
            "grad_norm": max(grad_norms) if grad_norms else 0.0, "rows": float(len(rows)),
            "update_tokens": float(sum(len(r.response_ids) for r in rows)), "seconds/update": seconds,
            "update_tokens_per_s": cfg.ppo_epochs * sum(len(r.prompt_ids) + len(r.response_ids) for r in rows)
            / max(seconds, 1e-9)})
        return metrics

    def _optimizer_step(self, rows: list[TurnRow], advantages: torch.Tensor, weights: torch.Tensor,
                        temperature: float, ref: list[torch.Tensor] | None, sums: dict[str, float],
                        gap: EngineGap | None = None, probes: list[BonusProbe] | None = None) -> dict[str, float]:
        """One optimiser step over `rows` and the bonus-only `probes`. `gap`: the rows were sampled by another
        engine and this is the only step from the rollout's weights: each micro-batch's own log-probs (detached)
        are the old ones, and its raw log-probs give the TIS weights."""
        cfg = self.config
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_total, clipped, tokens = 0.0, 0.0, 0.0
        bonus = self.entropy_coef
        probes = probes or []
        # the bonus's normaliser: every row with an action, each probe for as many rows as it stands for
        actions = sum(_has_action(row) for row in rows) + sum(p.count for p in probes) if bonus > 0 else 0
        loss_total += self._probe_bonus(probes, bonus, actions, temperature, sums)
        lengths = torch.tensor([len(row.response_ids) for row in rows])  # what the row weights were computed from
        if self.cut_after_action:
            rows = [cut_after_action(row) for row in rows]
            sums["response_tokens_cut"] = sums.get("response_tokens_cut", 0.0) + float(
                lengths.sum() - sum(len(row.response_ids) for row in rows))
        for shared, indices in self._prefix_passes(rows, sums):
            packed = self._pack([rows[i] for i in indices], shared)
            logprobs, entropy, raw = response_logprobs(self.model, packed, temperature=temperature,
                                                       with_entropy=True, with_raw=gap is not None,
                                                       chunked_head=self.chunked_head, entropy_grad=bonus > 0,
                                                       prefix=shared)
            assert entropy is not None
            free = free_positions(packed)
            action = action_positions(packed, [rows[i].action for i in indices], free)
            action_entropy = (entropy * action).sum()
            sums["action_entropy_sum"] = sums.get("action_entropy_sum", 0.0) + float(action_entropy.detach())
            sums["actions"] = sums.get("actions", 0.0) + float(action.sum())
            if gap is not None:
                assert raw is not None
                packed.old_logprobs = logprobs.detach()
                packed.token_weights = torch.ones_like(logprobs)
                for j, i in enumerate(indices):
                    k = len(rows[i].response_ids)
                    weights_row = gap.weights(rows[i], raw[j, raw.shape[1] - k:])
                    packed.token_weights[j, packed.token_weights.shape[1] - k:] = torch.tensor(weights_row)
            credit = None
            if cfg.action_loss_share is not None:
                credit = action_credit(packed.response_mask, action, free, cfg.action_loss_share,
                                       lengths=lengths[indices]).to(logprobs.device)
                packed.token_weights = credit if packed.token_weights is None else packed.token_weights * credit
            ref_lp = None if ref is None else _right_aligned([ref[i] for i in indices], logprobs.shape[1]).to(
                logprobs.device)
            result = clipped_surrogate_loss(
                logprobs=logprobs, old_logprobs=packed.old_logprobs,
                advantages=advantages[indices].to(logprobs.device), mask=packed.response_mask,
                clip_low=cfg.clip_low, clip_high=cfg.clip_high, ref_logprobs=ref_lp, kl_coef=cfg.kl_coef,
                kl_estimator=cfg.kl_estimator, weights=weights[indices].to(logprobs.device), entropy=entropy,
                token_weights=packed.token_weights, kl_weights=credit)
            loss = result.loss
            if bonus > 0:
                # the exploration floor on the action alone: -coef x the mean entropy of the step's actions
                loss = loss - bonus * action_entropy / max(actions, 1)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss {loss.item()}")
            loss.backward()
            loss_total += float(loss.detach())
            part = result.metrics
            weight = part["tokens"]
            tokens += weight
            clipped += part["clip_fraction"] * weight
            for key, value in part.items():
                sums[key] = sums.get(key, 0.0) + (value if key == "tokens" else value * weight)
        grad_norm = self._step()
        return {"loss": loss_total, "grad_norm": grad_norm, "clipped_tokens": clipped, "tokens": tokens}

    def _prefix_passes(self, rows: list[TurnRow], sums: dict[str, float],
                       model: torch.nn.Module | None = None) -> Iterator[tuple[SharedPrefix | None, list[int]]]:
        """The micro-batches of `rows`, each with the `SharedPrefix` its rows start with (with
        `share_prompt_prefix`), computed by `model` (default: the trained one), whose gradient is sent through it
        once its last micro-batch has run. Rows with the same prompt (a group's first turn under
        `group_shares_menu`) run it once for all of them; the other rows share the start every one of them has
        (the system message)."""
        parts = [list(range(len(rows)))]
        if self.share_prefix:
            by_prompt: dict[tuple[int, ...], list[int]] = defaultdict(list)
            for i, row in enumerate(rows):
                by_prompt[tuple(row.prompt_ids)].append(i)
            parts = [members for members in by_prompt.values() if len(members) > 1]
            parts.append(sorted(i for members in by_prompt.values() if len(members) == 1 for i in members))
        for members in parts:
            subset = [rows[i] for i in members]
            shared = SharedPrefix.of(self.model if model is None else model, subset, device=self.device) \
                if self.share_prefix else None
            length = shared.length if shared is not None else 0
            if shared is not None:
                sums["prefix_tokens_saved"] = sums.get("prefix_tokens_saved", 0.0) + length * (len(members) - 1)
            for indices in self._micro_batches(subset, prefix=length):
                yield shared, [members[j] for j in indices]
            if shared is not None:
                shared.backward()

    def _probe_bonus(self, probes: list[BonusProbe], bonus: float, actions: int, temperature: float,
                     sums: dict[str, float]) -> float:
        """Backpropagate -bonus x (the probes' action entropies, each times its count) / `actions`, the bonus's
        share of the loss from rows the policy gradient does not train."""
        loss_total = 0.0
        for indices in self._micro_batches([p.row for p in probes]):
            packed = self._pack([probes[i].row for i in indices])
            _, entropy, _ = response_logprobs(self.model, packed, temperature=temperature, with_entropy=True,
                                              chunked_head=self.chunked_head, entropy_grad=True)
            assert entropy is not None
            action = action_positions(packed, [probes[i].row.action for i in indices])
            counts = torch.tensor([float(probes[i].count) for i in indices], device=entropy.device)
            action_entropy = (entropy * action * counts[:, None]).sum()
            sums["action_entropy_sum"] = sums.get("action_entropy_sum", 0.0) + float(action_entropy.detach())
            sums["actions"] = sums.get("actions", 0.0) + float((action.sum(-1) * counts).sum())
            loss = -bonus * action_entropy / max(actions, 1)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss {loss.item()}")
            loss.backward()
            loss_total += float(loss.detach())
        return loss_total

    def _step(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        with self.policy.updating_weights():
            self.optimizer.step()
        self.model.eval()
        return float(grad_norm)

    def sft(self, rows: list[TurnRow]) -> dict[str, float]:
        """One optimiser step of token-mean negative log-likelihood over `rows` (the SFT baseline)."""
        if not rows:
            return {"rows": 0.0}
        self._activate()
        start = time.perf_counter()
        total = float(sum(len(r.response_ids) for r in rows))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_total, entropy_sum = 0.0, 0.0
        for indices in self._micro_batches(rows):
            packed = self._pack([rows[i] for i in indices])
            logprobs, entropy, _ = response_logprobs(self.model, packed, with_entropy=True,
                                                     chunked_head=self.chunked_head)
            loss = -(logprobs * packed.response_mask).sum() / total
            loss.backward()
            loss_total += float(loss.detach())
            assert entropy is not None
            entropy_sum += float((entropy * packed.response_mask).sum())
        grad_norm = self._step()
        seconds = time.perf_counter() - start
        return {"loss": loss_total, "grad_norm": grad_norm, "entropy": entropy_sum / total, "rows": float(len(rows)),
                "update_tokens": total, "optimizer_steps": 1.0, "seconds/update": seconds,
                "update_tokens_per_s": sum(len(r.prompt_ids) + len(r.response_ids) for r in rows)
                / max(seconds, 1e-9)}



def unmask_disagreeing_rows(rows: list[TurnRow]) -> int:
    """Rows holding a token their replayed mask forbids (the engine's grammar and the trainer's disagreed): their
    log-probs are taken unmasked, old and new alike, rather than -inf. Returns how many."""
    count = 0
    for row in rows:
        if row.allowed is not None and not bool(
                row.allowed[torch.arange(len(row.response_ids)), torch.tensor(row.response_ids)].all()):
            row.allowed = None
            row.action_tokens = row.action_choices = None  # token by token, as the rest of the row
            count += 1
    return count


class EngineGap:
    """The gap between another engine's raw log-probs and the trainer's, token by token, and the truncated
    importance weights it gives (all 1 with TIS off)."""

    def __init__(self, config: TrainConfig, temperature: float) -> None:
        self.settings = config.rollout_engine
        self.temperature = temperature or 1.0
        self.gaps: list[torch.Tensor] = []
        self.residuals: list[torch.Tensor] = []
        self.used: list[torch.Tensor] = []

    def weights(self, row: TurnRow, raw: torch.Tensor) -> list[float]:
        """The TIS weight of each token of `row`, from the trainer's raw log-probs `raw` of its response (all 1 for
        a row the trainer's own engine sampled)."""
        if row.engine_logprobs is None:
            return [1.0] * len(row.response_ids)
        delta = raw.detach().float().cpu() - torch.tensor(row.engine_logprobs, dtype=torch.float32)
        known = ~torch.isnan(delta)
        log_weight = torch.where(known, delta / self.temperature, torch.zeros_like(delta))
        log_used = log_weight.clamp(max=math.log(self.settings.tis_cap)) if self.settings.tis_enabled else \
            torch.zeros_like(log_weight)
        self.gaps.append(delta[known].abs())
        self.residuals.append((log_weight - log_used)[known].abs())
        self.used.append(torch.exp(log_used)[known])
        row.tis_weights = torch.exp(log_used).tolist()
        return row.tis_weights

    def metrics(self) -> dict[str, float]:
        gap = torch.cat(self.gaps) if self.gaps else torch.zeros(0)
        if not gap.numel():
            return {}
        residual, weight = torch.cat(self.residuals), torch.cat(self.used)
        return {"logprob_gap/mean": float(gap.mean()), "logprob_gap/max": float(gap.max()),
                "logprob_gap/share_over": float((gap > self.settings.gap_threshold).float().mean()),
                "logprob_gap/after_tis_mean": float(residual.mean()), "logprob_gap/tokens": float(gap.numel()),
                "tis/weight_mean": float(weight.mean()),
                "tis/truncated_share": float((residual > 0).float().mean()) if self.settings.tis_enabled else 0.0}

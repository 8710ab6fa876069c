"""The Flow-GRPO trainer: rollout in the live flow, score, advantages, clipped update, log, checkpoint, eval.

One step:
1. B questions from the resumable sampler; G trajectories each through `Flow.asolve` with the planner role
   on the policy engine (the model being trained, updated in place), concurrently.
2. Rewards from the scorer registry; infrastructure failures excluded and counted.
3. Advantages from the registry, one per planner-turn row (the trajectory's, broadcast to its turns).
4. The update (`update.py`): schema masks replayed, reference log-probs once per batch (LoRA: adapter
   disabled; full fine-tuning: a frozen copy), then `ppo_epochs` x mini-batches optimiser steps with the
   paper's loss normalisation by default, gradient accumulation over micro-batches, clipping, AdamW.
5. Scheduler step, metrics, rollout dump, checkpoint, held-out evaluation.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import os
import random
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from agentflow.engines.base import Engine
from agentflow.errors import ConfigError
from agentflow.flow import Flow
from agentflow.train.advantages import no_signal_groups, role_advantages
from agentflow.train.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from agentflow.train.config import TrainConfig
from agentflow.train.data import BatchSampler, Question, held_out_questions, training_questions
from agentflow.train.logprobs import plain_lm_head
from agentflow.train.metrics import MetricsLogger
from agentflow.train.policy import adapter_name, role_views
from agentflow.train.rollout import RolloutBatch, TurnRow, run_rollouts
from agentflow.train.update import PolicyUpdater, UpdateBatch
from agentflow.trajectory import ToolCall

if TYPE_CHECKING:
    from agentflow.engines.hf import TransformersEngine

log = logging.getLogger(__name__)

# characters of each held-out tool call's output kept in the evaluation's records
CALL_OUTPUT_CHARS = 300


def lr_lambda(config: TrainConfig):
    """Multiplier of the peak learning rate at a step: linear warmup, then constant / cosine / linear decay."""
    warmup, total = config.warmup_steps, max(config.max_steps, 1)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if config.lr_schedule == "constant":
            return 1.0
        progress = min(max(step - warmup, 0) / max(total - warmup, 1), 1.0)
        if config.lr_schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress

    return factor


def _call_record(call: ToolCall | None) -> dict[str, Any] | None:
    """A held-out turn's tool call as the executor wrote it and what it returned (the start of its output),
    for measures of the executor's own work; None where no call was made."""
    if call is None:
        return None
    return {"arguments": call.arguments, "output": call.output[:CALL_OUTPUT_CHARS],
            "error": call.error.kind if call.error else None}


def role_key(role: str, key: str) -> str:
    """A trained role's metric: the planner's as it always was, any other role's under `ROLE/`."""
    return key if role == "planner" else f"{role}/{key}"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def peak_memory_mb() -> float:
    """Peak resident memory of this process (CUDA: peak allocated on the device) in MiB."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Trainer:
    """Owns the policy, the flows, the optimiser and the run directory."""

    def __init__(self, config: TrainConfig, *, out_dir: str | Path | None = None,
                 engines: dict[str, Engine] | None = None, console: Any = None) -> None:
        self.config = config
        self.out_dir = Path(out_dir or config.output_dir)
        self.extra_engines = dict(engines or {})
        self.console = console
        self.step = 0
        self.sampler: BatchSampler | None = None

    # -- set-up -------------------------------------------------------------------------------------

    def _setup(self) -> None:
        from agentflow.engines.hf import TransformersEngine

        cfg = self.config
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        seed_everything(cfg.seed)
        self.train_items = training_questions(cfg.data)
        self.eval_items = held_out_questions(cfg.data)
        if cfg.eval_size:
            self.eval_items = self.eval_items[:cfg.eval_size]
        overlap = {q.question for q in self.train_items} & {q.question for q in self.eval_items}
        if overlap:
            log.warning("%d held-out questions also appear in the training set", len(overlap))

        self.ref_model: torch.nn.Module | None = None
        policy = self.extra_engines.get(cfg.policy_engine_name)
        if policy is None:
            from agentflow.engines.hf import load_policy

            model, tokenizer = load_policy(cfg.policy, trainable=cfg.algorithm != "frozen")
            if cfg.algorithm != "frozen":
                model = self._make_trainable(model)
            if cfg.planner_prefix:
                from agentflow.train.policy import PrefixedPlannerEngine

                policy = PrefixedPlannerEngine(cfg.policy, model=model, tokenizer=tokenizer,
                                               prefix=cfg.planner_prefix)
            else:
                policy = TransformersEngine(cfg.policy, model=model, tokenizer=tokenizer)
        if not isinstance(policy, TransformersEngine):
            raise TypeError("the planner's engine must be a TransformersEngine")
        self.policy = policy
        self.model = policy.model
        self.tokenizer = policy.tokenizer
        self.device = next(self.model.parameters()).device
        policy.seed_sampling(cfg.seed)
        self.rollout_policy: Any = None
        """The llama.cpp engine the planner samples from (rollout_engine kind llamacpp); None: `policy`."""
        if cfg.rollout_engine.kind == "llamacpp":
            self.rollout_policy = self._llamacpp_policy(policy)
        elif cfg.rollout_engine.kind == "vllm":
            self.rollout_policy = self._vllm_policy(policy)
        if self.rollout_policy is not None:
            self.rollout_policy.seed_sampling(cfg.seed)

        engines = {**self.extra_engines, cfg.policy_engine_name: self.rollout_policy or policy}
        rollout_flow, eval_flow = cfg.rollout_flow_config(), cfg.eval_flow_config()
        if cfg.role_adapters:
            engines.update(role_views(rollout_flow, self.rollout_policy or policy, cfg))
            role_views(eval_flow, self.rollout_policy or policy, cfg)
        self.flow = Flow.from_config(rollout_flow, engines=engines)
        self.eval_flow = Flow.from_config(eval_flow, engines=self.flow.engines, tools=self.flow.tools)
        self.role_params = self._role_params()
        self.trainable_names = {name for names in self.role_params.values() for name in names}
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.schedulers: dict[str, Any] = {}
        self.updaters: dict[str, PolicyUpdater] = {}
        named = dict(self.model.named_parameters())
        for role in cfg.train_roles:
            params = [named[name] for name in self.role_params[role]]
            self.optimizers[role] = torch.optim.AdamW(params or [torch.nn.Parameter(torch.zeros(1))],
                                                      lr=cfg.role_learning_rate(role), betas=cfg.adam_betas,
                                                      weight_decay=cfg.weight_decay)
            self.schedulers[role] = torch.optim.lr_scheduler.LambdaLR(self.optimizers[role], lr_lambda(cfg))
            self.updaters[role] = PolicyUpdater(
                cfg, model=self.model, optimizer=self.optimizers[role], policy=policy, pad_id=self._pad_id(),
                ref_model=self.ref_model, chunked_head=plain_lm_head(self.model),
                adapter=adapter_name(role) if cfg.adapter_roles else None,
                max_grad_norm=cfg.role_max_grad_norm(role))
        first = cfg.train_roles[0]
        self.optimizer, self.scheduler, self.updater = self.optimizers[first], self.schedulers[first], \
            self.updaters[first]
        self.sampler = BatchSampler(self.train_items, batch_size=cfg.batch_size, seed=cfg.seed,
                                    stratify_field=cfg.data.stratify_field)
        self.metrics = MetricsLogger(self.out_dir, console=self.console)

    def _role_params(self) -> dict[str, list[str]]:
        """The names of the parameters each trained role trains: its own adapter's, or (one role) every
        parameter that requires gradients."""
        cfg = self.config
        if not cfg.adapter_roles:
            return {cfg.train_roles[0]: [n for n, p in self.model.named_parameters() if p.requires_grad]}
        return {role: [n for n, _ in self.model.named_parameters() if f".{adapter_name(role)}." in n]
                for role in cfg.train_roles}

    def _make_trainable(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap the loaded model for training: LoRA adapters, or every weight plus a frozen reference copy."""
        cfg = self.config
        if cfg.lora.enabled:
            from peft import LoraConfig, get_peft_model

            def lora() -> LoraConfig:
                return LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                                  target_modules=cfg.lora.targets, task_type="CAUSAL_LM")

            # an adapter loaded by load_policy(trainable=True) is PEFT's "default": the planner's, trained further.
            # The reference is then that start (the paper's initial policy), not the base without it: a frozen copy
            # with the adapter merged in. With other roles trained too, theirs is the base, so it stays the base.
            if cfg.kl_coef > 0 and hasattr(model, "peft_config") and list(cfg.train_roles) == ["planner"]:
                self.ref_model = copy.deepcopy(model).merge_and_unload().eval().requires_grad_(False)
            for role in cfg.train_roles:
                name = adapter_name(role)
                if not hasattr(model, "peft_config"):
                    model = get_peft_model(model, lora(), adapter_name=name)
                elif name not in model.peft_config:
                    model.add_adapter(name, lora())
        else:
            if cfg.kl_coef > 0:
                self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            model.requires_grad_(True)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if hasattr(model, "enable_input_require_grads"):
                model.enable_input_require_grads()
        model.eval()
        n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info("trainable parameters: %d", n_train)
        return model

    def _llamacpp_policy(self, policy: TransformersEngine) -> Any:
        """llama.cpp over the policy's base re-written as F16 (or Q8_0), to carry the trainer's adapter (synced
        later); every role on the policy engine samples from it, the frozen ones without an adapter."""
        from agentflow.bundled import bundled_model_path
        from agentflow.config import LlamaCppEngineConfig
        from agentflow.train.engine_rollout import LlamaCppPolicyEngine
        from agentflow.train.export import converted_gguf

        settings, model = self.config.rollout_engine, self.config.policy.model
        base = bundled_model_path() if model is None else Path(model).expanduser()
        if base.suffix != ".gguf" or not base.is_file():
            raise ConfigError(f"rollout_engine kind 'llamacpp' needs the policy's base model as a GGUF file (the "
                              f"bundled model, or a .gguf path); got {model!r}")
        config = LlamaCppEngineConfig(model_path=str(converted_gguf(base, settings.base)),
                                      n_parallel=settings.n_parallel, n_threads=settings.n_threads,
                                      n_ctx=settings.n_ctx)
        adapters = [adapter_name(role) for role in self.config.train_roles]
        return LlamaCppPolicyEngine(config, trainer_engine=policy, work_dir=self.out_dir / "rollout_engine",
                                    adapters=adapters, base_requests=self.config.role_adapters)

    def _vllm_policy(self, policy: TransformersEngine) -> Any:
        """A vLLM server that loads the trainer's adapter at runtime (`engine_rollout.VLLMPolicyEngine`)."""
        import os

        from agentflow.train.engine_rollout import VLLMPolicyEngine

        settings = self.config.rollout_engine
        assert settings.base_url is not None
        adapter_dir = Path(settings.adapter_dir) if settings.adapter_dir else self.out_dir / "rollout_engine"
        api_key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        return VLLMPolicyEngine(base_url=settings.base_url, trainer_engine=policy, adapter_dir=adapter_dir,
                                api_key=api_key, adapters=[adapter_name(role) for role in self.config.train_roles])

    def _sync_rollout_policy(self) -> dict[str, Any]:
        """Hand the trainer's current weights to the rollout engine when it holds older ones. A failed sync
        leaves the engine refusing to sample (its trajectories are infrastructure failures, not rewards from a
        stale policy) and is retried before the next rollout."""
        engine = self.rollout_policy
        if engine is None or (engine.weights_version == self.policy.weights_version and engine.stale is None):
            return {}
        try:
            return engine.sync(self.model, self.policy.weights_version)
        except Exception as err:
            log.error("the rollout engine could not load the new weights: %s: %s", type(err).__name__, err)
            return {"sync/failed": 1.0}

    def _resume(self) -> None:
        checkpoints = list_checkpoints(self.out_dir / "checkpoints")
        if not checkpoints:
            log.warning("--resume: no checkpoint in %s; starting from step 0", self.out_dir)
            return
        with self.policy.updating_weights():
            state = load_checkpoint(checkpoints[-1], model=self.model, optimizer=self.optimizer,
                                    scheduler=self.scheduler, roles=self._other_roles())
        self.step = int(state["step"])
        if state.get("policy_sampling") is not None:
            (self.rollout_policy or self.policy).load_sampling_state(state["policy_sampling"])
        assert self.sampler is not None
        self.sampler.position = int(state["data_position"])
        for role, coef in state.get("action_entropy_coef", {}).items():  # adapted towards action_entropy_target
            self.updaters[role].entropy_coef = float(coef)
        log.info("resumed from %s (step %d, data position %d)", checkpoints[-1], self.step, self.sampler.position)

    # -- one step -----------------------------------------------------------------------------------

    def _other_roles(self) -> dict[str, tuple[torch.optim.Optimizer, Any]]:
        """Every trained role after the first, with its own optimiser and scheduler (checkpoints)."""
        return {role: (self.optimizers[role], self.schedulers[role]) for role in self.config.train_roles[1:]}

    def _rollout_temperature(self, role: str = "planner") -> float:
        return getattr(self.config.rollout_flow_config().roles, role).sampling.temperature or 1.0

    @contextmanager
    def _update_threads(self) -> Iterator[None]:
        """torch's threads for the update (`torch_threads`); on exit, the policy engine's own (`n_threads`).

        torch's thread count is one per process: while rolling out, the policy's engine shares the cores with
        the other engines (its `n_threads`); the update has them to itself."""
        if self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
        try:
            yield
        finally:
            if self.config.policy.n_threads:
                torch.set_num_threads(self.config.policy.n_threads)

    def _pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)

    async def _grpo_step(self, questions: list[Question]) -> dict[str, Any]:
        cfg = self.config
        metrics: dict[str, Any] = self._sync_rollout_policy()
        batch = await run_rollouts(self.flow, questions, group_size=cfg.group_size,
                                   concurrency=cfg.rollout_concurrency, tool_call_cost=cfg.tool_call_cost,
                                   variants=cfg.group_variants(self.step))
        metrics.update({"seconds/rollout": batch.seconds, **batch.metrics()})
        roles = cfg.train_roles
        by_role = {role: batch.rows(engine_logprobs=self.rollout_policy is not None, role=role) for role in roles}
        for role, (rows, _) in by_role.items():
            metrics[f"rollout_{role}_tokens_per_s"] = sum(len(r.response_ids) for r in rows) / max(batch.seconds, 1e-9)
        n_groups = len({q.id for q in questions})
        advantages = self._advantages(batch, by_role)
        if batch.rollouts:
            metrics["no_signal_share"] = (no_signal_groups(batch.rewards(), batch.group_ids())
                                          + n_groups - len(set(batch.group_ids()))) / n_groups
        else:
            metrics["no_signal_share"] = 1.0
        self._dump_rollouts(batch, {role: (by_role[role][1], advantages[role]) for role in roles})
        groups = batch.group_ids()
        for role in roles:
            rows, row_traj = by_role[role]
            update = UpdateBatch(rows=rows, advantages=advantages[role],
                                 row_group=[groups[t] for t in row_traj.tolist()], trajectories=dict(Counter(groups)))
            with self._update_threads():
                result = self.updaters[role].grpo(update, temperature=self._rollout_temperature(role), step=self.step)
            metrics.update({role_key(role, k): v for k, v in result.items()})
            metrics[role_key(role, "lr")] = self.schedulers[role].get_last_lr()[0]
        with warnings.catch_warnings():
            # a step without signal takes no optimiser step, but the schedule counts steps, not updates:
            # torch's notice about a scheduler stepped before its optimiser does not apply
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before",
                                    category=UserWarning)
            for scheduler in self.schedulers.values():
                scheduler.step()
        return metrics

    def _advantages(self, batch: RolloutBatch, by_role: dict[str, tuple[list[TurnRow], torch.Tensor]]
                    ) -> dict[str, torch.Tensor]:
        cfg = self.config
        if not batch.rollouts:
            return {role: torch.zeros(len(rows)) for role, (rows, _) in by_role.items()}
        return role_advantages(cfg.advantage, rewards=batch.rewards(), group_ids=batch.group_ids(),
                               trajectory_ids=batch.trajectory_ids(), eps=cfg.advantage_eps,
                               row_trajectory={role: row_traj for role, (_, row_traj) in by_role.items()},
                               scope=cfg.role_advantages)

    def _dump_rollouts(self, batch: RolloutBatch, by_role: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The step's trajectories (DIR/rollouts/step-N.jsonl): per trajectory its group, reward, whether its answer
        was right, the advantage each planner turn received (with other trained roles, each role's calls' under
        `role_advantages`), and the whole trajectory, to see what was learnt."""
        role_advantages: dict[str, dict[int, list[float]]] = {}
        for role, (row_traj, advantages) in by_role.items():
            for t, advantage in zip(row_traj.tolist(), advantages.tolist(), strict=True):
                role_advantages.setdefault(role, {}).setdefault(t, []).append(round(advantage, 6))
        per_trajectory = role_advantages.get("planner", {})
        path = self.out_dir / "rollouts" / f"step-{self.step:06d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as out:
            for t, r in enumerate(batch.rollouts + batch.excluded):
                failure = r.infrastructure or next(iter(r.trajectory.failures), None)
                out.write(json.dumps({
                    "id": r.trajectory_id, "group": r.question.id, "question": r.question.question,
                    "gold": r.question.answer, "planner": [c.text for c in r.trajectory.planner_calls()],
                    "tools": [turn.tool for turn in r.trajectory.turns], "answer": r.trajectory.answer,
                    "reward": r.score.value if r.score else None,
                    "correct": r.score.correct if r.score else None,
                    "advantages": per_trajectory.get(t, []) if r.score else [],
                    **({"role_advantages": {role: values.get(t, []) if r.score else []
                                            for role, values in role_advantages.items()}}
                       if self.config.adapter_roles else {}),
                    "infrastructure": r.infrastructure.kind if r.infrastructure else None,
                    "failure": failure.model_dump() if failure else None,
                    "trajectory": r.trajectory.model_dump(mode="json")}) + "\n")

    # -- SFT baseline ------------------------------------------------------------------------------

    def _sft_rows(self, batch: RolloutBatch) -> list[TurnRow]:
        """Planner turns of the teacher's correct trajectories, tokenised for the policy."""
        rows = []
        prefix = self.config.planner_prefix or ""
        for rollout in batch.rollouts:
            if not (rollout.score and rollout.score.correct):
                continue
            for call in rollout.trajectory.planner_calls():
                # with a planner prefix, the policy's prompt ends with it: train on the rest of the reply
                tok = self.tokenizer if prefix and call.text.startswith(prefix) else getattr(
                    self.tokenizer, "raw", self.tokenizer)
                reply = call.text[len(prefix):] if tok is self.tokenizer and prefix else call.text
                text = tok.apply_chat_template(call.messages, tokenize=False, add_generation_prompt=True)
                prompt = tok(text, add_special_tokens=False)["input_ids"]
                response = tok(reply, add_special_tokens=False)["input_ids"]
                end = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() else tok.eos_token_id
                response = response + [end]
                rows.append(TurnRow(0, list(prompt), response, [0.0] * len(response)))
        return rows

    async def _collect_teacher(self) -> list[TurnRow]:
        from agentflow.engines import build_engine

        cfg = self.config
        assert cfg.teacher is not None and self.sampler is not None
        teacher = self.extra_engines.get("teacher") or build_engine(cfg.teacher)
        engines = {**self.flow.engines, cfg.policy_engine_name: teacher}
        teacher_flow = Flow.from_config(cfg.rollout_flow_config(), engines=engines, tools=self.flow.tools)
        n_questions = max(cfg.max_steps, 1) * cfg.batch_size
        questions = [q for _ in range(0, n_questions, cfg.batch_size) for q in self.sampler.next_batch()]
        batch = await run_rollouts(teacher_flow, questions, group_size=cfg.sft_trajectories,
                                   concurrency=cfg.rollout_concurrency)
        rows = self._sft_rows(batch)
        self.metrics.log(0, {"sft/teacher_accuracy": batch.metrics()["accuracy"], "sft/rows": len(rows),
                             "seconds/teacher_rollout": batch.seconds})
        if teacher is not self.extra_engines.get("teacher"):
            await teacher.aclose()
        return rows

    # -- evaluation --------------------------------------------------------------------------------

    async def evaluate(self, label: str | int) -> dict[str, Any]:
        """Accuracy of the current planner on the held-out questions (one greedy trajectory each)."""
        self._sync_rollout_policy()
        batch = await run_rollouts(self.eval_flow, self.eval_items, group_size=1,
                                   concurrency=self.config.rollout_concurrency)
        # the tools picked at each turn are kept (frozen vs trained choices); the all-turn shares are not
        metrics = {f"eval/{k}": v for k, v in batch.metrics().items()
                   if not k.startswith("tool/") or k.startswith("tool/turn")}
        kinds: dict[str, list[bool]] = {}
        records = []
        for r in batch.rollouts + batch.excluded:
            correct = bool(r.score and r.score.correct)
            kinds.setdefault(str(r.question.meta.get("kind", "all")), []).append(correct)
            records.append({"id": r.question.id, "question": r.question.question, "gold": r.question.answer,
                            "answer": r.trajectory.answer, "correct": correct,
                            "tools": [turn.tool for turn in r.trajectory.turns],
                            "calls": [_call_record(turn.tool_call) for turn in r.trajectory.turns],
                            "infrastructure": r.infrastructure.kind if r.infrastructure else None})
        for kind, values in kinds.items():
            metrics[f"eval/accuracy/{kind}"] = sum(values) / len(values)
        # accuracy over all held-out questions, failures counted wrong, for the headline number
        metrics["eval/accuracy_all"] = sum(rec["correct"] for rec in records) / max(len(records), 1)
        metrics["eval/questions"] = len(records)
        metrics["eval/seconds"] = batch.seconds
        path = self.out_dir / "eval" / f"{label}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".jsonl.partial")  # the file exists only once complete (what --resume reads)
        partial.write_text("".join(json.dumps(rec) + "\n" for rec in records))
        os.replace(partial, path)
        return metrics

    # -- the run -----------------------------------------------------------------------------------

    def _checkpoint(self) -> None:
        assert self.sampler is not None
        save_checkpoint(self.out_dir / "checkpoints", step=self.step, model=self.model, optimizer=self.optimizer,
                        scheduler=self.scheduler, keep=self.config.keep_checkpoints,
                        state={"data_position": self.sampler.position, "algorithm": self.config.algorithm,
                               "train_roles": self.config.train_roles,
                               "action_entropy_coef": {role: u.entropy_coef for role, u in self.updaters.items()}},
                        sampling_state=(self.rollout_policy or self.policy).sampling_state(),
                        trainable=self.trainable_names, roles=self._other_roles())

    async def arun(self, *, resume: bool = False) -> dict[str, Any]:
        """Train (or only evaluate, for `frozen` and max_steps 0); return the final metrics."""
        cfg = self.config
        if not resume:
            self._refuse_finished_work()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._setup()
        (self.out_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
        if resume:
            self._resume()
        final: dict[str, Any] = {}
        try:
            training = cfg.algorithm != "frozen" and cfg.max_steps > 0
            if (cfg.eval_at_start or not training) and self.step == 0:
                final = await self.evaluate("step-0")
                self.metrics.log(0, final)
            if training:
                final = await self._train_loop()
            self.metrics.log(self.step, {"peak_memory_mb": peak_memory_mb()})
        finally:
            self.metrics.close()
            await self.flow.aclose()
        return final

    def _refuse_finished_work(self) -> None:
        """A fresh run never writes into another run's directory: its metrics, rollouts and evaluations would be
        overwritten or mixed with the new run's (`--resume` continues that run instead)."""
        checkpoints = list_checkpoints(self.out_dir / "checkpoints")
        metrics = self.out_dir / "metrics.jsonl"
        if checkpoints or (metrics.is_file() and metrics.stat().st_size > 0):
            held = f"checkpoints up to {checkpoints[-1].name}" if checkpoints else "metrics.jsonl"
            raise ConfigError(f"{self.out_dir} already holds a run ({held}): pass --resume to continue it, or "
                              "another --out (or remove the directory) to start afresh")

    async def _train_loop(self) -> dict[str, Any]:
        cfg = self.config
        assert self.sampler is not None
        sft_rows: list[TurnRow] = []
        if cfg.algorithm == "sft":
            sft_rows = await self._collect_teacher() * cfg.sft_epochs
            random.Random(cfg.seed).shuffle(sft_rows)
        last_eval: dict[str, Any] = {}
        if self.step == cfg.max_steps and not (self.out_dir / "eval" / f"step-{self.step}.jsonl").is_file():
            # resumed after its last step, whose evaluation did not finish (or a run resumed with --max-steps at
            # a checkpoint's step): evaluate it now
            last_eval = await self.evaluate(f"step-{self.step}")
            self.metrics.log(self.step, last_eval)
        per_step = math.ceil(len(sft_rows) / max(cfg.max_steps, 1)) if sft_rows else 0
        while self.step < cfg.max_steps:
            step_start = time.perf_counter()
            self.step += 1
            if cfg.algorithm == "sft":
                chunk = sft_rows[(self.step - 1) * per_step:self.step * per_step]
                with self._update_threads():
                    metrics: dict[str, Any] = self.updater.sft(chunk)
                metrics["lr"] = self.scheduler.get_last_lr()[0]
                self.scheduler.step()
            else:
                metrics = await self._grpo_step(self.sampler.next_batch())
            metrics["seconds/step"] = time.perf_counter() - step_start
            metrics["peak_memory_mb"] = peak_memory_mb()
            self.metrics.log(self.step, metrics)
            done = self.step == cfg.max_steps
            if self.step % cfg.save_every == 0 or done:
                self._checkpoint()
            if (cfg.eval_every and self.step % cfg.eval_every == 0) or done:
                last_eval = await self.evaluate(f"step-{self.step}")
                self.metrics.log(self.step, last_eval)
        self.save_planner()
        return last_eval

    def save_planner(self) -> Path:
        """Write the trained planner where `agentflow solve` / `eval` load it: DIR/final/{adapter,model}[.gguf];
        every other trained role's beside it, DIR/final/ROLE/{adapter,model,ROLE.gguf}."""
        from agentflow.train.export import export_planner

        cfg, final = self.config, self.out_dir / "final"
        for role in cfg.train_roles:
            export_planner(self.model, self.tokenizer, final if role == "planner" else final / role,
                           lora=cfg.lora.enabled, gguf=cfg.export_gguf,
                           adapter=adapter_name(role) if cfg.adapter_roles else None, gguf_file=f"{role}.gguf")
        return final

    def run(self, *, resume: bool = False) -> dict[str, Any]:
        return asyncio.run(self.arun(resume=resume))

"""`agentflow train --backend verl`: our training config, plus a `verl:` section, mapped onto verl's keys.

The file format is the single-machine one (`agentflow.train.config.TrainConfig`, same fields, same meaning)
with one more section, `verl:`, for what only a cluster has (nodes, GPUs, rollout backend, ...). Every field
either maps onto verl's configuration, is honoured by our agent loop, or is refused with an error when the
file sets it: `FIELD_ROUTES` says which, for every field, and a test keeps it complete.

This module does not import verl: the mapping can be printed and reviewed anywhere.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentflow.config import LlamaCppEngineConfig, OpenAIEngineConfig, TransformersEngineConfig
from agentflow.train.config import TrainConfig

VERL_GRPO_EPS = 1e-6
"""The epsilon verl's GRPO estimator adds to the group std (fixed in verl 0.9.1)."""

NO_DUAL_CLIP = 1.0e9
"""verl's PPO loss always applies dual-clip with `clip_ratio_c`; ours has none. A ratio cap this large makes
verl's min() pick the ordinary clipped term, so the loss is ours."""

PLUGIN_MODULE = "agentflow.verl.plugin"
RUNTIME_ENV = "ray_kwargs.ray_init.runtime_env.env_vars"

AGENT_LOOP_NAME = "agentflow"
"""Name our agent loop is registered under in verl (`rollout.agent.default_agent_loop`)."""

ESTIMATORS: dict[str, dict[str, Any]] = {
    # One advantage per trajectory from its group of G trajectories, copied to its turns: verl's v1 trainer
    # does exactly this for multi-output agent loops (GRPO over each session's final output, broadcast).
    "grpo_trajectory": {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": True},
    "no_std": {"algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": False},
    # Normalise over every turn row of the question's group: our registry's function, registered in verl by
    # `agentflow.verl.plugin` (verl then hands it all rows, grouped by question uid).
    "grpo_turn_rows": {"algorithm.adv_estimator": "agentflow_grpo_turn_rows",
                       "algorithm.norm_adv_by_std_in_grpo": True},
}

FIELD_ROUTES: dict[str, str] = {
    "algorithm": "grpo -> the PPO trainer; frozen -> trainer.val_only (evaluate, no update); sft: refused",
    "train_roles": "refused unless [planner]: verl trains one policy on its rollout servers (the planner)",
    "role_optim": "refused when set (one trained role: use learning_rate / max_grad_norm)",
    "role_advantages": "no effect with one trained role (the planner's rows are all the rows)",
    "flow": "agent loop: the flow every trajectory runs (planner engine -> actor_rollout_ref.model.path, "
            "lora_adapter_path; other roles on their own frozen engines)",
    "lora": "actor_rollout_ref.model.lora_rank / lora_alpha / target_modules (dropout other than 0: refused)",
    "gradient_checkpointing": "actor_rollout_ref.model.enable_gradient_checkpointing",
    "share_prompt_prefix": "no effect: the single-machine update's saving; verl's actor computes every row whole",
    "data": "agent loop + parquet files for data.train_files / data.val_files",
    "batch_size": "data.train_batch_size",
    "group_size": "actor_rollout_ref.rollout.n",
    "max_turns": "agent loop (flow.limits.max_turns)",
    "temperature": "actor_rollout_ref.rollout.temperature (and the planner's recorded sampling)",
    "tool_call_cost": "agent loop: the reward each trajectory returns (FlowRunner scores with it)",
    "group_shares_menu": "refused when true: verl's agent loop draws each trajectory's menu order from its own "
                         "request id",
    "group_menu_orders": "refused when not 1: it needs group_shares_menu, which verl refuses",
    "planner_max_tokens": "data.max_response_length (a planner turn's response) and the planner's max_tokens",
    "planner_prefix": "refused: the verl planner engine sends the chat-templated prompt ids unchanged",
    "rollout_engine": "refused when set: verl's rollout servers sample the planner (verl.rollout_backend), "
                      "with its own old-log-prob handling (verl.old_logprobs)",
    "rollout_concurrency": "agent loop: trajectories in flight per agent-loop worker = ceil(this / workers)",
    "learning_rate": "actor_rollout_ref.actor.optim.lr",
    "lr_schedule": "actor_rollout_ref.actor.optim.lr_scheduler_type (linear: refused, FSDP has no linear)",
    "warmup_steps": "actor_rollout_ref.actor.optim.lr_warmup_steps",
    "weight_decay": "actor_rollout_ref.actor.optim.weight_decay",
    "adam_betas": "actor_rollout_ref.actor.optim.betas",
    "max_grad_norm": "actor_rollout_ref.actor.optim.clip_grad and actor.grad_clip",
    "clip_low": "actor_rollout_ref.actor.clip_ratio_low (and clip_ratio)",
    "clip_high": "actor_rollout_ref.actor.clip_ratio_high",
    "kl_coef": "actor_rollout_ref.actor.use_kl_loss (coef > 0) and kl_loss_coef",
    "action_entropy_coef": "refused when > 0: verl's entropy_coeff weighs every token's entropy, not the action's",
    "action_entropy_rows": "with action_entropy_coef, which verl refuses: only the default (signal) is accepted",
    "action_entropy_target": "adapts action_entropy_coef, which verl refuses: only the default (none) is accepted",
    "action_entropy_coef_step": "the step of action_entropy_target's adaptation, which verl refuses",
    "action_loss_share": "refused when set: verl's policy loss weighs a response's tokens alike (loss_agg_mode)",
    "action_logprob": "refused unless token: verl's actor takes every response token's own log-prob",
    "kl_estimator": "actor_rollout_ref.actor.kl_loss_type (k1, k2, k3; verl clamps k3 to [-10, 10])",
    "advantage": "algorithm.adv_estimator and norm_adv_by_std_in_grpo (see ESTIMATORS; batch_trajectory refused)",
    "advantage_eps": "fixed at 1e-6 in verl: other values refused",
    "loss_aggregation": "actor_rollout_ref.actor.loss_agg_mode (token-mean, seq-mean-token-mean; verl has no "
                        "per-trajectory mode: trajectory_turn_token_mean refused, default seq_mean_token_mean)",
    "ppo_epochs": "actor_rollout_ref.actor.ppo_epochs",
    "ppo_mini_batch_size": "actor_rollout_ref.actor.ppo_mini_batch_size (x max_turns rows per question)",
    "micro_batch_rows": "refused when set: verl packs micro-batches by tokens (use micro_batch_tokens)",
    "micro_batch_tokens": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu (dynamic batch size; also ref "
                          "and rollout log-prob passes)",
    "max_steps": "trainer.total_training_steps (0: trainer.val_only)",
    "seed": "data.seed, actor_rollout_ref.actor.data_loader_seed, actor_rollout_ref.rollout.seed",
    "eval_every": "trainer.test_freq (0: only before training and after the last step)",
    "eval_size": "data.val_max_samples",
    "eval_at_start": "trainer.val_before_train",
    "eval_temperature": "actor_rollout_ref.rollout.val_kwargs.temperature / do_sample",
    "save_every": "trainer.save_freq",
    "keep_checkpoints": "trainer.max_actor_ckpt_to_keep",
    "output_dir": "trainer.default_local_dir (= DIR/checkpoints), validation_data_dir, rollout_data_dir, "
                  "TENSORBOARD_DIR; our data/ and trajectories/",
    "export_gguf": "refused when true: convert the checkpoint (agentflow.verl.convert) and export from there",
    "torch_threads": "refused when set (a CPU setting)",
    "teacher": "refused when set (sft is a single-machine baseline)",
    "sft_trajectories": "refused when set (sft is a single-machine baseline)",
    "sft_epochs": "refused when set (sft is a single-machine baseline)",
    "verl": "the cluster section, see VerlSettings",
}


class VerlSettings(BaseModel):
    """What only a verl run needs: the cluster, the rollout servers, the trainer's bookkeeping."""

    model_config = ConfigDict(extra="forbid")

    nnodes: int = Field(1, ge=1, description="Machines in the Ray cluster (trainer.nnodes).")
    n_gpus_per_node: int = Field(8, ge=1, description="GPUs per machine (trainer.n_gpus_per_node).")
    rollout_backend: Literal["vllm", "sglang"] = Field(
        "vllm", description="Rollout server engine (actor_rollout_ref.rollout.name).")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per rollout server replica "
                                      "(rollout.tensor_model_parallel_size).")
    gpu_memory_utilization: float = Field(0.5, gt=0.0, le=1.0, description="Share of GPU memory the rollout "
                                          "server may take (rollout.gpu_memory_utilization).")
    max_prompt_length: int = Field(4096, ge=64, description="Longest planner prompt, in tokens, that becomes a "
                                   "training row (data.max_prompt_length). A longer prompt is still answered, "
                                   "but its row is masked out of the loss and counted.")
    strategy: Literal["fsdp", "fsdp2"] = Field("fsdp", description="Training engine sharding "
                                                "(actor_rollout_ref.actor.strategy).")
    param_offload: bool = Field(False, description="Offload FSDP parameters to CPU between passes.")
    optimizer_offload: bool = Field(False, description="Offload optimiser state to CPU between steps.")
    old_logprobs: Literal["recompute", "rollout"] = Field(
        "recompute", description="PPO's old log-probs: 'recompute' them with the training engine (verl's "
        "default: vLLM and FSDP numerics differ) or use the rollout server's ('rollout', as the "
        "single-machine trainer does; algorithm.rollout_correction.bypass_mode).")
    agent_workers: int = Field(8, ge=1, description="Agent-loop worker processes running flows "
                               "(rollout.agent.num_workers).")
    project_name: str = Field("agentflow", description="trainer.project_name (loggers, checkpoint paths).")
    experiment_name: str = Field("flow-grpo", description="trainer.experiment_name.")
    loggers: list[Literal["console", "wandb", "tensorboard", "mlflow", "swanlab"]] = Field(
        default_factory=lambda: ["console", "tensorboard"], description="trainer.logger backends.")
    log_trajectories: Literal["none", "summary", "full"] = Field(
        "summary", description="What the agent loop appends to OUTPUT_DIR/trajectories/*.jsonl per trajectory: "
        "'summary' (id, reward, turns, rows, exclusion), 'full' (the whole trajectory record) or nothing.")
    overrides: list[str] = Field(
        default_factory=list, description="Extra verl Hydra overrides ('key=value'), applied as given, for "
        "verl settings we do not model. A key this mapping sets is refused here, so nothing is set twice.")


POLICY_FIELDS_MAPPED = {"kind", "model", "adapter", "dtype"}
"""Fields of the planner's transformers engine that verl honours (model.path, lora_adapter_path, bf16)."""


def _changed(model: BaseModel, name: str) -> bool:
    """True when `name` differs from its default: a setting that asks for something. Writing a default
    changes nothing, so it is never refused."""
    field = type(model).model_fields[name]
    default = field.get_default(call_default_factory=True)
    return getattr(model, name) != default


def _refuse(message: str) -> ValueError:
    return ValueError(f"verl backend: {message}")


class VerlTrainConfig(TrainConfig):
    """The single-machine training config plus `verl:`; defaults differ only where a GPU cluster needs it."""

    verl: VerlSettings = Field(default_factory=VerlSettings)
    micro_batch_tokens: int = Field(16384, ge=64, description="Tokens per GPU per forward/backward pass "
                                    "(verl packs rows up to this budget; must hold the longest row).")
    export_gguf: bool = Field(False, description="Not available on verl: convert the checkpoint first.")
    loss_aggregation: Literal["trajectory_turn_token_mean", "token_mean", "seq_mean_token_mean"] = Field(
        "seq_mean_token_mean", description="verl's loss_agg_mode: token_mean or seq_mean_token_mean (verl's "
        "loss has no per-trajectory normalisation, so the paper's trajectory_turn_token_mean is refused).")
    rollout_concurrency: int = Field(256, ge=1, description="Trajectories in flight at once over all agent-loop "
                                     "workers (each worker runs its share; the frozen endpoint sees at most this "
                                     "many concurrent flows).")

    @model_validator(mode="after")
    def _check_verl(self) -> VerlTrainConfig:
        if self.algorithm == "sft":
            raise _refuse("algorithm 'sft' is a single-machine baseline; run it with `agentflow train`")
        for name in ("torch_threads", "teacher", "sft_trajectories", "sft_epochs", "micro_batch_rows",
                     "export_gguf", "planner_prefix", "rollout_engine"):
            if _changed(self, name):
                raise _refuse(f"`{name}` has no verl equivalent ({FIELD_ROUTES[name]}); remove it")
        for name, used in (("action_entropy_coef", self.action_entropy_coef > 0),
                           ("action_entropy_target", self.action_entropy_target is not None)):
            if used:
                raise _refuse(f"{name}: {FIELD_ROUTES[name]}; remove it, or train with `agentflow train` (local "
                              "backend)")
        if self.group_shares_menu:
            raise _refuse(f"group_shares_menu: {FIELD_ROUTES['group_shares_menu']}; remove it, or train with "
                          "`agentflow train` (local backend)")
        if self.action_loss_share is not None:
            raise _refuse(f"action_loss_share: {FIELD_ROUTES['action_loss_share']}; remove it, or train with "
                          "`agentflow train` (local backend)")
        if self.action_logprob != "token":
            raise _refuse(f"action_logprob: {FIELD_ROUTES['action_logprob']}; remove it, or train with "
                          "`agentflow train` (local backend)")
        if self.data.stratify_field is not None:
            raise _refuse("data.stratify_field: verl's dataloader draws its own batches (one shuffle of the "
                          "parquet file); remove it, or train with `agentflow train` (local backend)")
        if self.lr_schedule == "linear":
            raise _refuse("lr_schedule 'linear' is not offered by verl's FSDP engine; use constant or cosine")
        if self.advantage_eps != VERL_GRPO_EPS:
            raise _refuse(f"advantage_eps is fixed at {VERL_GRPO_EPS} in verl's GRPO; remove it")
        if self.advantage not in ESTIMATORS:
            raise _refuse(f"advantage {self.advantage!r} has no verl mapping; known: {', '.join(ESTIMATORS)}")
        if self.lora.enabled and self.lora.dropout != 0.0:
            raise _refuse("LoRA dropout is not configurable in verl's FSDP LoRA; set lora.dropout to 0")
        if self.loss_aggregation == "trajectory_turn_token_mean":
            raise _refuse("loss_aggregation trajectory_turn_token_mean (the paper's 1/G 1/T_i 1/|a|) has no verl "
                          "loss_agg_mode; use seq_mean_token_mean (closest: a trajectory weighs by its turns) or "
                          "token_mean, or train with `agentflow train` (local backend)")
        if self.train_roles != ["planner"] or self.role_optim:
            raise _refuse(f"train_roles {self.train_roles} (and role_optim): verl trains one policy, the planner, on "
                          "its rollout servers; train other roles with `agentflow train` (local backend)")
        self._check_policy()
        self._check_roles()
        flow = self.rollout_flow_config()
        planner = flow.roles.planner.sampling
        if planner.seed is not None:
            raise _refuse("the planner's sampling seed would make the G rollouts of a question identical; "
                          "remove it (verl seeds its rollout servers from `seed`)")
        longest = self.verl.max_prompt_length + planner.max_tokens
        if self.micro_batch_tokens < longest:
            raise _refuse(f"micro_batch_tokens ({self.micro_batch_tokens}) must hold the longest row: "
                          f"verl.max_prompt_length + planner max_tokens = {longest}")
        self._check_overrides()
        return self

    def _check_policy(self) -> None:
        policy = self.policy
        if policy.model is None or policy.model.lower().endswith(".gguf"):
            raise _refuse("the planner's engine needs `model`: a Hugging Face checkpoint directory (or hub id) "
                          "that verl's FSDP and vLLM load; GGUF files are for llama.cpp")
        if policy.dtype not in ("auto", "bfloat16"):
            raise _refuse(f"policy dtype {policy.dtype!r}: verl trains in bfloat16 mixed precision; use 'auto'")
        for name in type(policy).model_fields:
            if name not in POLICY_FIELDS_MAPPED and _changed(policy, name):
                raise _refuse(f"the policy engine's `{name}` is a transformers-engine setting with no verl "
                              "equivalent (verl places and batches the policy itself); remove it")

    def _check_roles(self) -> None:
        policy_name = self.policy_engine_name
        for role in type(self.flow.roles).model_fields:
            if role == "planner":
                continue
            engine_name = getattr(self.flow.roles, role).engine
            if engine_name == policy_name:
                raise _refuse(f"role {role!r} uses the trained policy engine {policy_name!r}; on verl only the "
                              "planner runs on the rollout servers: give the other roles a frozen engine (an "
                              "OpenAI-compatible server, see docs/verl.md)")
            engine = self.flow.engines[engine_name]
            if isinstance(engine, TransformersEngineConfig):
                raise _refuse(f"role {role!r} uses a transformers engine; every agent-loop worker would load "
                              "its own copy of the model. Serve it with vLLM and use kind 'openai'")
            if not isinstance(engine, (OpenAIEngineConfig, LlamaCppEngineConfig)):
                raise _refuse(f"role {role!r}: engine kind {engine.kind!r} is not supported on verl")

    def _check_overrides(self) -> None:
        mapped = set(verl_overrides(self, train_files="-", val_files="-"))
        for item in self.verl.overrides:
            key, sep, _ = item.lstrip("+~").partition("=")
            if not sep:
                raise _refuse(f"override {item!r} is not of the form key=value")
            if key in mapped:
                raise _refuse(f"override {item!r} sets {key}, which the config already maps "
                              f"({_route_of(key)}); change the agentflow field instead")


def _route_of(key: str) -> str:
    return next((f"field {name}: {route}" for name, route in FIELD_ROUTES.items() if key in route), "mapped")


def response_length(cfg: VerlTrainConfig) -> int:
    """Tokens of one planner response: the planner's max_tokens (a row is one planner turn)."""
    return cfg.rollout_flow_config().roles.planner.sampling.max_tokens


def max_turns(cfg: VerlTrainConfig) -> int:
    return cfg.rollout_flow_config().limits.max_turns


def verl_overrides(cfg: VerlTrainConfig, *, train_files: str, val_files: str, resume: bool = False) -> dict[str, Any]:
    """Dotted verl keys -> values, for every setting we map. Applied on top of verl's `ppo_trainer` config.

    `resume` is the train command's `--resume`: continue from the newest checkpoint in the run directory
    (verl's resume_mode 'auto'), else start fresh ('disable'), as the single-machine trainer does."""
    flow = cfg.rollout_flow_config()
    planner = flow.roles.planner.sampling
    policy = cfg.policy
    out_dir = Path(cfg.output_dir).absolute()
    # As the single-machine trainer: a mini-batch holds every planner-turn row of its questions (each question
    # G trajectories x up to max_turns rows); verl pads it with no-op rows.
    mini_batch_questions = (cfg.ppo_mini_batch_size or cfg.batch_size) * flow.limits.max_turns
    evaluate_only = cfg.algorithm == "frozen" or cfg.max_steps == 0
    actor = "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"
    model = "actor_rollout_ref.model"
    o: dict[str, Any] = {
        # the v1 trainer: multi-output agent loops, one row per planner turn
        "trainer.use_v1": True,
        "trainer.v1.trainer_mode": "sync",
        # data
        "data.train_files": train_files,
        "data.val_files": val_files,
        "data.train_batch_size": cfg.batch_size,
        "data.max_prompt_length": cfg.verl.max_prompt_length,
        "data.max_response_length": response_length(cfg),
        "data.return_raw_chat": True,
        "data.shuffle": True,
        "data.seed": cfg.seed,
        "data.val_max_samples": cfg.eval_size if cfg.eval_size is not None else -1,
        # the policy
        f"{model}.path": policy.model,
        f"{model}.lora_adapter_path": policy.adapter,
        f"{model}.lora_rank": cfg.lora.rank if cfg.lora.enabled else 0,
        f"{model}.lora_alpha": cfg.lora.alpha,
        f"{model}.target_modules": list(cfg.lora.targets),
        f"{model}.enable_gradient_checkpointing": cfg.gradient_checkpointing,
        # optimiser
        f"{actor}.strategy": cfg.verl.strategy,
        f"{actor}.optim.lr": cfg.learning_rate,
        f"{actor}.optim.lr_scheduler_type": cfg.lr_schedule,
        f"{actor}.optim.lr_warmup_steps": cfg.warmup_steps,
        f"{actor}.optim.weight_decay": cfg.weight_decay,
        f"{actor}.optim.betas": list(cfg.adam_betas),
        f"{actor}.optim.clip_grad": cfg.max_grad_norm,
        f"{actor}.grad_clip": cfg.max_grad_norm,
        f"{actor}.fsdp_config.param_offload": cfg.verl.param_offload,
        f"{actor}.fsdp_config.optimizer_offload": cfg.verl.optimizer_offload,
        # the loss
        f"{actor}.policy_loss.loss_mode": "vanilla",
        f"{actor}.clip_ratio": cfg.clip_low,
        f"{actor}.clip_ratio_low": cfg.clip_low,
        f"{actor}.clip_ratio_high": cfg.clip_high,
        f"{actor}.clip_ratio_c": NO_DUAL_CLIP,
        f"{actor}.use_kl_loss": cfg.kl_coef > 0,
        f"{actor}.kl_loss_coef": cfg.kl_coef,
        f"{actor}.kl_loss_type": cfg.kl_estimator,
        f"{actor}.entropy_coeff": 0.0,
        f"{actor}.loss_agg_mode": cfg.loss_aggregation.replace("_", "-"),
        f"{actor}.ppo_epochs": cfg.ppo_epochs,
        f"{actor}.ppo_mini_batch_size": mini_batch_questions,
        f"{actor}.use_dynamic_bsz": True,
        f"{actor}.ppo_max_token_len_per_gpu": cfg.micro_batch_tokens,
        f"{actor}.data_loader_seed": cfg.seed,
        "algorithm.use_kl_in_reward": False,
        "algorithm.rollout_correction.bypass_mode": cfg.verl.old_logprobs == "rollout",
        **ESTIMATORS[cfg.advantage],
        # rollout servers and the agent loop
        f"{rollout}.name": cfg.verl.rollout_backend,
        f"{rollout}.mode": "async",
        f"{rollout}.n": cfg.group_size,
        f"{rollout}.temperature": planner.temperature,
        f"{rollout}.top_p": planner.top_p,
        f"{rollout}.top_k": -1,
        f"{rollout}.do_sample": True,
        f"{rollout}.seed": cfg.seed,
        f"{rollout}.calculate_log_probs": True,
        f"{rollout}.tensor_model_parallel_size": cfg.verl.tensor_parallel_size,
        f"{rollout}.gpu_memory_utilization": cfg.verl.gpu_memory_utilization,
        f"{rollout}.val_kwargs.temperature": cfg.eval_temperature,
        f"{rollout}.val_kwargs.top_p": planner.top_p,
        f"{rollout}.val_kwargs.top_k": -1,
        f"{rollout}.val_kwargs.n": 1,
        f"{rollout}.val_kwargs.do_sample": cfg.eval_temperature > 0,
        f"{rollout}.agent.num_workers": cfg.verl.agent_workers,
        f"{rollout}.agent.default_agent_loop": AGENT_LOOP_NAME,
        f"{rollout}.agent.agent_loop_config_path": str(agent_loop_config_path()),
        # schedule, evaluation, checkpoints, cluster
        "trainer.total_training_steps": max(cfg.max_steps, 1),
        "trainer.total_epochs": max(cfg.max_steps, 1),
        "trainer.val_only": evaluate_only,
        "trainer.val_before_train": cfg.eval_at_start or evaluate_only,
        "trainer.test_freq": cfg.eval_every if cfg.eval_every > 0 else max(cfg.max_steps, 1),
        "trainer.save_freq": cfg.save_every,
        "trainer.max_actor_ckpt_to_keep": cfg.keep_checkpoints,
        "trainer.default_local_dir": str(out_dir / "checkpoints"),
        "trainer.validation_data_dir": str(out_dir / "validation"),
        "trainer.rollout_data_dir": str(out_dir / "rollouts"),
        "trainer.resume_mode": "auto" if resume else "disable",
        "trainer.nnodes": cfg.verl.nnodes,
        "trainer.n_gpus_per_node": cfg.verl.n_gpus_per_node,
        "trainer.project_name": cfg.verl.project_name,
        "trainer.experiment_name": cfg.verl.experiment_name,
        "trainer.logger": list(cfg.verl.loggers),
        # every Ray worker imports our plugin (agent loop, estimator) with verl; TensorBoard under the run dir
        f"{RUNTIME_ENV}.VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE,
        f"{RUNTIME_ENV}.TENSORBOARD_DIR": str(out_dir / "tensorboard"),
    }
    return o


def agent_loop_config_path() -> Path:
    """The shipped agent-loop registration file verl reads (`rollout.agent.agent_loop_config_path`)."""
    from importlib import resources

    return Path(str(resources.files("agentflow") / "configs" / "verl_agent_loop.yaml"))


def agentflow_section(cfg: VerlTrainConfig) -> dict[str, Any]:
    """Our config as plain data, carried inside verl's config (key `agentflow`) to every agent-loop worker,
    so no worker needs to read a file from the launching machine. `output_dir` is made absolute: workers on
    other nodes start in other directories."""
    section = cfg.model_dump(mode="json")
    section["output_dir"] = str(Path(cfg.output_dir).absolute())
    return section


def workers_concurrency(cfg: VerlTrainConfig) -> int:
    """Trajectories one agent-loop worker runs at once, so that all workers together run rollout_concurrency."""
    return max(1, math.ceil(cfg.rollout_concurrency / cfg.verl.agent_workers))

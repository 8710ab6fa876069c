"""Typed configuration of `agentflow train`. Every field says what it does and where it comes from.

Loaded from YAML (`TrainConfig.from_yaml`); unknown keys are errors, so no setting is accepted and then
ignored. `src/agentflow/configs/train_*.yaml` are commented examples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentflow.config import (
    EngineConfig,
    FlowConfig,
    LimitsConfig,
    LlamaCppEngineConfig,
    RoleConfig,
    RolesConfig,
    TransformersEngineConfig,
    read_yaml_mapping,
    validation_message,
)
from agentflow.engines.base import SamplingParams
from agentflow.errors import ConfigError

POLICY_ENGINE = "policy"
"""Name under which the trainable planner engine enters the flow's engine table."""

TrainableRole = Literal["planner", "executor", "verifier", "generator"]
"""The flow's modules that can learn (`train_roles`); each trained one gets its own LoRA adapter."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraSettings(_Strict):
    """Low-rank adapters (Hu et al. 2021, via `peft`): train a few million parameters instead of all.

    With LoRA the frozen reference policy is the base model with the adapter disabled, so no second copy
    of the model is held in memory.
    """

    enabled: bool = Field(True, description="Train LoRA adapters (True) or every weight (False).")
    rank: int = Field(16, ge=1, description="Adapter rank r.")
    alpha: int = Field(32, ge=1, description="Adapter scale numerator: updates are scaled by alpha / rank.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input (0 keeps "
                           "rollout and update log-probs identical).")
    targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Module names that get adapters (peft `target_modules`).")


class RolloutEngineSettings(_Strict):
    """Where the planner's rollouts are sampled (`rollout_engine.*`)."""

    kind: Literal["transformers", "llamacpp", "vllm"] = Field(
        "transformers", description="transformers: the trainer's own model samples (exact log-probs, slow); "
        "llamacpp: llama.cpp over an F16 copy of the base with the trainer's LoRA adapter, re-synced after every "
        "optimiser step (needs LoRA and a llama-architecture GGUF base, such as the bundled model); vllm: a vLLM "
        "server at base_url that loads the adapter at runtime after every step (needs LoRA).")
    base_url: str | None = Field(None, description="vllm: the server's OpenAI-compatible address, e.g. "
                                 "http://gpu-host:8000/v1.")
    api_key_env: str | None = Field(None, description="vllm: environment variable holding the server's API key.")
    adapter_dir: str | None = Field(None, description="vllm: a folder the server can read, where each step's "
                                    "adapter is saved; default: the run directory's rollout_engine/.")
    n_parallel: int = Field(8, ge=1, description="llamacpp: requests decoded together (llama.cpp slots).")
    n_threads: int | None = Field(None, ge=1, description="llamacpp: CPU threads; default: half the cores, at "
                                  "most 4.")
    base: Literal["f16", "q8_0"] = Field(
        "f16", description="llamacpp: the base weights the adapter is applied to, the policy's GGUF re-written as "
        "F16 (log-probs within ~0.003 nats of the trainer's) or Q8_0 (faster to read prompts on a CPU, further "
        "from the trainer's; truncated importance sampling corrects for the gap).")
    n_ctx: int = Field(16384, ge=512, description="llamacpp: context tokens over all slots (each slot holds "
                       "n_ctx / n_parallel: prompt + reply).")
    tis: bool | None = Field(None, description="Truncated importance sampling: weigh each token's policy "
                             "gradient by min(pi_trainer / pi_engine, tis_cap), correcting for the engine's "
                             "numerical gap to the trainer. None: on when the engine is not the trainer's "
                             "(llamacpp).")
    tis_cap: float = Field(2.0, ge=1.0, description="The truncation C of the importance weights (verl's default).")
    gap_threshold: float = Field(0.1, gt=0.0, description="Tokens whose engine and trainer log-probs differ by "
                                 "more than this (nats) are counted in the metric logprob_gap/share_over.")

    @property
    def tis_enabled(self) -> bool:
        return self.kind != "transformers" if self.tis is None else self.tis


class DataSettings(_Strict):
    """Where questions come from. Files are JSONL, JSON (a list) or parquet, one question per record."""

    task: str = Field("lookup_compute", description="Shipped task used where train_path / eval_path are unset: "
                      "lookup_compute (look a number up, then compute: two tools in sequence) or tool_use (one "
                      "tool per question). `python -m agentflow.train.tasks` regenerates them.")
    train_path: str | None = Field(None, description="Training questions; default: the shipped task's train split.")
    eval_path: str | None = Field(None, description="Held-out questions; default: the shipped task's held-out "
                                  "split (no question shared with training).")
    question_field: str = Field("question", description="Record field holding the question text.")
    answer_field: str = Field("answer", description="Record field holding the gold answer.")
    reward_field: str = Field("reward", description="Record field naming the scorer (`agentflow.scoring`).")
    default_reward: str = Field("exact_match", description="Scorer for records without `reward_field`.")
    id_field: str = Field("id", description="Record field holding a stable item id (else the line number).")
    stratify_field: str | None = Field(
        None, description="Record field whose values split the training questions into strata (e.g. `kind` in "
        "the mixed task): each epoch interleaves the shuffled strata in proportion to their sizes, so every batch "
        "holds each stratum in its share (equal strata, batch_size a multiple of their number: the same count of "
        "each). None: one shuffle of all questions.")
    exclude_train_ids: list[str] = Field(
        default_factory=list, description="Item ids dropped from the training questions (never from the held-out "
        "ones), e.g. those the frozen flow answers with no tool, whose reward would teach answering at once "
        "(`benchmarks/planner_ceiling.py --modes const: --records FILE` lists them). An id not in the training "
        "questions is an error.")


class RoleOptimSettings(_Strict):
    """One trained role's own training settings (`role_optim.ROLE.*`); unset: the run's."""

    learning_rate: float | None = Field(None, gt=0.0, description="This role's AdamW peak learning rate.")
    max_grad_norm: float | None = Field(None, gt=0.0, description="Clip this role's gradient norm to this value.")
    temperature: float | None = Field(None, gt=0.0, description="This role's sampling temperature during "
                                      "rollouts (the trainer's log-probs are of the same tempered distribution).")


def menu_variants(step: int, group_size: int, orders: int) -> list[int]:
    """The menu variant of each trajectory of a group at `step` when the group shares `orders` menu orders: runs of
    group_size / orders trajectories, the variants new each step (one order: the step's number)."""
    return [step * orders + index * orders // group_size for index in range(group_size)]


def _default_train_flow() -> FlowConfig:
    """Planner on the trainable policy; the other roles on the bundled model through llama.cpp."""
    helper = LlamaCppEngineConfig(n_parallel=8, n_threads=1)
    return FlowConfig(
        engines={POLICY_ENGINE: TransformersEngineConfig(), "helper": helper},
        roles=RolesConfig(
            planner=RoleConfig(engine=POLICY_ENGINE, sampling=SamplingParams(temperature=1.0, max_tokens=64)),
            executor=RoleConfig(engine="helper", sampling=SamplingParams(max_tokens=96)),
            verifier=RoleConfig(engine="helper", sampling=SamplingParams(max_tokens=32)),
            generator=RoleConfig(engine="helper", sampling=SamplingParams(max_tokens=48)),
            tools=RoleConfig(engine="helper", sampling=SamplingParams(max_tokens=128)),
        ),
        tools={"python": {}, "wikipedia_search": {}},
        limits=LimitsConfig(max_turns=1, max_seconds=120.0, memory_tokens=256, result_chars=300),
        query_analysis=False,
    )


class TrainConfig(_Strict):
    """Flow-GRPO (Li et al. 2025, "In-the-Flow Agentic System Optimization"): the planner learns on-policy
    inside the live multi-turn flow from one outcome reward per trajectory."""

    algorithm: Literal["grpo", "sft", "frozen"] = Field(
        "grpo", description="'grpo': Flow-GRPO; 'sft': fine-tune on correct trajectories of `teacher`; "
        "'frozen': no update, only evaluation (the untrained baseline).")

    # -- the policy -------------------------------------------------------------------------------
    train_roles: list[TrainableRole] = Field(
        default_factory=lambda: ["planner"], description="The modules that learn from the outcome reward "
        "(planner, executor, verifier, generator; default: the planner, as the paper). Each gets its own LoRA "
        "adapter over the one base model of the policy engine, which every trained role's engine must be; its "
        "calls become its own training rows.")
    role_optim: dict[TrainableRole, RoleOptimSettings] = Field(
        default_factory=dict, description="Per trained role, its own learning_rate / max_grad_norm / rollout "
        "temperature (the `role_optim.ROLE.*` keys); each trained role has its own AdamW state and schedule.")
    role_advantages: Literal["per_role", "shared"] = Field(
        "per_role", description="per_role: each trained role's rows get their advantages group-normalised among "
        "that role's rows; shared: one normalisation over the rows of every role. Identical for estimators that "
        "normalise trajectories (grpo_trajectory); they differ for grpo_turn_rows.")
    flow: FlowConfig = Field(
        default_factory=_default_train_flow,
        description="The flow the planner learns inside (engines of the other roles, tools, limits). The "
        "planner role's engine must be a `transformers` engine: it is the trainable policy. In a YAML file, "
        "`flow: FILE` reads it from a flow config file beside the training config.")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA adapters (the `lora.*` keys).")
    share_prompt_prefix: bool = Field(True, description="Run the prompt start every row of an update shares (the "
                                      "planner's system message; a group's whole first prompt under "
                                      "group_shares_menu) through the model once per optimiser step instead of once "
                                      "per row, in the update and in its passes without gradient (the reference "
                                      "log-probs of kl_coef, the old log-probs of rows another engine sampled): same "
                                      "gradient, fewer tokens. Off under gradient_checkpointing and for models where "
                                      "it does not reproduce the whole rows' outputs.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward: less memory, "
                                         "about 30% more update time.")

    # -- data -------------------------------------------------------------------------------------
    data: DataSettings = Field(default_factory=DataSettings, description="Question files and fields (the "
                               "`data.*` keys below).")

    # -- rollout ----------------------------------------------------------------------------------
    batch_size: int = Field(4, ge=1, description="B: questions per step.")
    group_size: int = Field(8, ge=2, description="G: trajectories per question (GRPO's group; Shao et al. 2024).")
    max_turns: int | None = Field(None, ge=1, description="Planner turns per trajectory; overrides "
                                  "flow.limits.max_turns when set.")
    temperature: float | None = Field(None, gt=0.0, description="Sampling temperature of the trained roles "
                                      "during rollouts; overrides their flow.roles.ROLE.sampling.temperature when "
                                      "set.")
    tool_call_cost: float = Field(
        0.0, ge=0.0, lt=1.0, description="What each tool call after a trajectory's first takes off its reward "
        "(never below 0): with it, a right answer reached in fewer calls pays more, so a group whose rollouts are "
        "all right still says which plan was shorter. 0: the paper's outcome reward alone. Training rewards only; "
        "accuracy and evaluation count right answers.")
    group_shares_menu: bool = Field(
        False, description="With the flow's shuffle_tools: the G trajectories of a question's group see one menu "
        "order, drawn anew each step, instead of one order each. Their first prompt is then the same, so the group "
        "compares G samples of one distribution (as GRPO's group does), and the update runs that prompt once for "
        "the group (share_prompt_prefix). false: each rollout its own order (the trajectory's index in its group), "
        "the same orders every step.")
    group_menu_orders: int = Field(
        1, ge=1, description="With group_shares_menu: K menu orders a group, each seen by G / K of its "
        "trajectories (K must divide G), all drawn anew each step; the group and its baseline stay all G. A planner "
        "that picks by the position an action is listed at is then rewarded for that position under one order and "
        "not under another, so the update credits the action, not the position. 1: one order a group.")
    planner_max_tokens: int | None = Field(None, ge=1, description="Planner reply budget in tokens; overrides "
                                           "flow.roles.planner.sampling.max_tokens when set.")
    planner_prefix: str | None = Field(
        None, description="Text every planner reply is made to start with, appended to the prompt after the "
        "assistant header (e.g. '{\"tool_name\": \"'): the cheapest constrained output that keeps the RL exact; "
        "rollouts and evaluation both use it. None: the planner writes its whole reply.")
    rollout_concurrency: int = Field(32, ge=1, description="Trajectories in flight at once (the policy engine "
                                     "batches concurrent planner calls up to its max_batch_size).")
    rollout_engine: RolloutEngineSettings = Field(
        default_factory=RolloutEngineSettings, description="Where the planner's rollouts and evaluations are "
        "sampled (the `rollout_engine.*` keys): the trainer's transformers model, or llama.cpp with the "
        "adapter synced after every step.")

    # -- optimisation -----------------------------------------------------------------------------
    learning_rate: float = Field(2e-4, gt=0.0, description="AdamW peak learning rate.")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="Decay after warmup: constant, cosine to 0, or linear to 0 at max_steps.")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup from 0 over this many steps.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay.")
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="Clip the global gradient norm to this value.")
    clip_low: float = Field(0.2, ge=0.0, description="Ratio clip below 1 - clip_low (PPO; Schulman et al. 2017).")
    clip_high: float = Field(0.28, ge=0.0, description="Ratio clip above 1 + clip_high; larger than clip_low "
                             "keeps exploration alive (DAPO's clip-higher; Yu et al. 2025).")
    kl_coef: float = Field(0.001, ge=0.0, description="Weight of the KL penalty to the frozen reference: the "
                           "policy as it starts (a planner-only run from `engines.policy.adapter`: that adapter, "
                           "merged into a frozen copy; else the base model); 0 skips the reference forward pass "
                           "entirely. Per token, with the tokens weighted as action_loss_share weighs the policy "
                           "term.")
    action_entropy_coef: float = Field(
        0.0, ge=0.0, description="Weight of an entropy bonus on each reply's action alone: the first token the "
        "policy chose freely (under the planner's schema, which tool). Adds -coef x the mean entropy of the "
        "update's actions to the loss: an exploration floor on the choice of tool, where a bonus over all tokens "
        "would also reward noise in the free sub-goal text. 0: none, as the paper. Acts on the rows the update "
        "trains (rows with a nonzero advantage: under the group estimators, groups with signal; all with kl_coef > 0 "
        "or action_entropy_rows: all). With action_logprob: tool the entropy is that of the choice of tool (each "
        "tool's probability the total of the tokens that start it), else of the action token. The metric "
        "action_entropy is logged either way.")
    action_entropy_rows: Literal["signal", "all"] = Field(
        "signal", description="Rows the action entropy bonus acts on. signal: those the update trains anyway (groups "
        "with signal). all: every row with an action, rows of groups without signal too (they join the update "
        "with advantage 0, so the bonus alone moves them; each is cut after its action, and rows alike up to "
        "there are computed once). A "
        "question whose every rollout chose the same wrong tool gives its group no signal, so under `signal` "
        "nothing holds its choice open, and a preference learnt on other questions can close it for good.")
    action_entropy_target: float | None = Field(
        None, ge=0.0, description="Raise the action entropy bonus's weight while the action's entropy is under this "
        "value (nats; with action_logprob: tool at most ln of the number of tools): after each update whose rows "
        "had actions, the weight rises by action_entropy_coef_step when the measured action_entropy was under the "
        "target and falls back by it when over, never below action_entropy_coef (its start); it is saved in each "
        "checkpoint. Skywork-OR1's adaptive entropy control, here on the action alone. A fixed weight only slows a "
        "drift of every question to one tool; this one pushes harder the longer the drift lasts. A policy that is "
        "right is nearly certain of its tool, so the target is a floor under the spread, well below uniform. "
        "None: the weight stays action_entropy_coef.")
    action_entropy_coef_step: float = Field(
        0.01, gt=0.0, description="The step of the adaptive action entropy weight (action_entropy_target), per "
        "update.")
    action_loss_share: float | None = Field(
        None, ge=0.0, le=1.0, description="Share of each reply's weight in the policy loss that its action token "
        "(the tool it named) carries; the rest is spread evenly over the reply's other free tokens (the sub-goal "
        "text). None: every token alike, the paper's 1/|a|, under which the one token that chose the tool gets "
        "about 1/30 of a planner reply's gradient. The row's own weight (loss_aggregation) does not change. The "
        "KL term (kl_coef) is spread the same way, so that it holds back what the policy term moves. 1.0: the "
        "tokens after the action carry no gradient, so the update computes each row (and its reference "
        "log-probs) up to its action only (the same step; the loss metrics, clip_fraction, entropy and kl_ref, "
        "are then over those tokens).")
    action_logprob: Literal["token", "tool"] = Field(
        "token", description="What the policy loss takes as the probability of a reply's action (its tool, "
        "`action_loss_share`). token: the token the reply drew there, as for every other token. tool: the total "
        "probability of every token the schema allowed there that starts the same tool (\"p\", \"py\", \"python\" "
        "for python), the probability of the choice itself. A tokenizer can start one tool several ways, so the "
        "token-level update raises one spelling while lowering another: on the mixed task's first tool choice "
        "(tool_choice_probe.py, seed 0) it pulled every question to python in 10 steps, where the tool-level one "
        "learnt the kinds apart; the trainer's bandit with tool learnt them in one seed of three (docs/training.md). "
        "tool recomputes the old log-probs in the trainer's forward pass (one pass more with several PPO epochs "
        "or mini-batches and the transformers engine).")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="Per-token KL estimator (Schulman's k1/k2/k3; GRPO uses k3).")
    advantage: str = Field("grpo_trajectory", description="Advantage estimator from the registry in "
                           "`agentflow.train.advantages`: grpo_trajectory, grpo_turn_rows, no_std, batch_trajectory.")
    advantage_eps: float = Field(1e-6, ge=0.0, description="Added to the group std before dividing.")
    loss_aggregation: Literal["trajectory_turn_token_mean", "token_mean", "seq_mean_token_mean"] = Field(
        "trajectory_turn_token_mean", description="trajectory_turn_token_mean: the paper's 1/G * 1/T_i * 1/|a| "
        "(every trajectory weighs the same, whatever its turns and tokens); token_mean: every token weighs the "
        "same (DAPO); seq_mean_token_mean: every planner turn weighs the same (GRPO per turn).")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each rollout batch (verl's ppo_epochs). Above 1, "
                            "later updates start away from the rollout policy and the clip acts.")
    ppo_mini_batch_size: int | None = Field(
        None, ge=1, description="Questions per optimiser step (verl's ppo_mini_batch_size, counted in "
        "questions: each brings its G trajectories and all their turns); None: the whole batch in one step. "
        "batch_size / this many steps per epoch.")
    micro_batch_rows: int = Field(8, ge=1, description="Planner-turn rows per forward/backward pass; gradients "
                                  "accumulate over micro-batches into one optimiser step per batch.")
    micro_batch_tokens: int = Field(4096, ge=64, description="Also cap a micro-batch at this many padded "
                                    "tokens (rows x longest row).")

    # -- schedule, evaluation, checkpoints --------------------------------------------------------
    max_steps: int = Field(30, ge=0, description="Optimiser steps (one rollout batch each); 0 only evaluates.")
    seed: int = Field(0, description="Seeds data order, sampling and initialisation.")
    eval_every: int = Field(10, ge=0, description="Evaluate on the held-out set every K steps (0: only at the "
                            "start and the end).")
    eval_size: int | None = Field(None, ge=1, description="Held-out questions per evaluation (first N); "
                                  "None: all.")
    eval_at_start: bool = Field(True, description="Evaluate the untrained planner before step 1.")
    eval_temperature: float = Field(0.0, ge=0.0, description="Temperature of the trained roles during "
                                    "evaluation.")
    save_every: int = Field(10, ge=1, description="Write a checkpoint every N steps (and at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept on disk (oldest deleted first).")
    output_dir: str = Field("runs/train", description="Run directory: metrics.jsonl, TensorBoard events, "
                            "checkpoints, the final planner.")
    export_gguf: bool = Field(True, description="Also write the trained planner as a GGUF file for llama.cpp.")
    torch_threads: int | None = Field(None, ge=1, description="torch intra-op threads; default: torch's choice.")

    # -- SFT baseline -----------------------------------------------------------------------------
    teacher: EngineConfig | None = Field(
        None, description="Engine of the stronger teacher whose correct trajectories' planner turns `sft` "
        "trains on (any engine kind, e.g. an OpenAI-compatible server).")
    sft_trajectories: int = Field(2, ge=1, description="Teacher trajectories per training question for sft.")
    sft_epochs: int = Field(1, ge=1, description="Passes over the collected teacher turns.")

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        self._check_train_roles()
        kind = self.rollout_engine.kind
        if kind != "transformers" and self.algorithm == "grpo" and not self.lora.enabled:
            raise ValueError(f"rollout_engine kind {kind!r} syncs the LoRA adapter after each step: it needs "
                             "lora.enabled (full fine-tuning rolls out on kind 'transformers')")
        if kind == "vllm" and not self.rollout_engine.base_url:
            raise ValueError("rollout_engine kind 'vllm' needs base_url (the vLLM server's /v1 address)")
        if self.planner_prefix and self.flow.planner_tool_last:
            raise ValueError("planner_prefix starts the planner's reply with its tool, but flow.planner_tool_last "
                             "asks for the tool last: set one of them")
        if self.action_entropy_rows == "all" and self.action_entropy_coef == 0 and self.action_entropy_target is None:
            raise ValueError("action_entropy_rows: all widens the action entropy bonus to every row, but "
                             "action_entropy_coef is 0 (no bonus): set a coefficient or an action_entropy_target, "
                             "or leave the rows at 'signal'")
        if self.group_menu_orders > 1 and not self.group_shares_menu:
            raise ValueError("group_menu_orders gives a group several shared menu orders: it needs group_shares_menu")
        if self.group_size % self.group_menu_orders:
            raise ValueError(f"group_menu_orders {self.group_menu_orders} does not divide group_size "
                             f"{self.group_size}: each order is seen by G / K trajectories")
        if self.algorithm == "sft" and self.teacher is None:
            raise ValueError("algorithm 'sft' needs a `teacher` engine")
        from agentflow.train.advantages import ADVANTAGE_ESTIMATORS

        if self.advantage not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"unknown advantage estimator {self.advantage!r}; known: "
                             f"{', '.join(sorted(ADVANTAGE_ESTIMATORS))}")
        return self

    def group_variants(self, step: int) -> list[int] | None:
        """The menu variant of each trajectory of a group at `step` (its index in the group -> variant, as
        `run_rollouts` takes them): with group_shares_menu, K = group_menu_orders runs of G / K trajectories,
        the variants new each step; otherwise None (each trajectory its index)."""
        return menu_variants(step, self.group_size, self.group_menu_orders) if self.group_shares_menu else None

    def _check_train_roles(self) -> None:
        roles = self.train_roles
        if not roles or len(set(roles)) != len(roles):
            raise ValueError(f"train_roles must name each trained role once, got {roles}")
        engines = {getattr(self.flow.roles, role).engine for role in roles}
        if len(engines) > 1:
            raise ValueError(f"every trained role must be on one engine (the policy: one base model with an "
                             f"adapter per role); train_roles {roles} are on {sorted(engines)}")
        policy = self.policy_engine_name
        if not isinstance(self.flow.engines[policy], TransformersEngineConfig):
            raise ValueError(f"the {roles[0]}'s engine {policy!r} must be kind 'transformers' (the trainable "
                             f"policy), got {self.flow.engines[policy].kind!r}")
        if self.frozen_policy_roles and not self.lora.enabled and self.algorithm != "frozen":
            raise ValueError(f"{self.frozen_policy_roles} run on the trained engine {policy!r} but are not in "
                             "train_roles: without LoRA they would run on the trained weights. Give them another "
                             "engine, or enable lora (they then run on the base model, without any adapter)")
        stray = sorted(set(self.role_optim) - set(roles))
        if stray:
            raise ValueError(f"role_optim names {stray}, which train_roles does not train")
        if roles != ["planner"]:
            if not self.lora.enabled:
                raise ValueError("training a role other than the planner, or several, needs lora.enabled (one "
                                 "LoRA adapter per role over one base)")
            if self.algorithm == "sft":
                raise ValueError("algorithm 'sft' trains the planner only: train_roles must be [planner]")
        flow = self.rollout_flow_config()
        for role in roles:
            top_p = getattr(flow.roles, role).sampling.top_p
            if self.algorithm == "grpo" and top_p < 1.0:
                raise ValueError(f"the {role}'s top_p is {top_p}: training needs top_p = 1 (the trainer "
                                 "recomputes log-probs of the full tempered distribution; a nucleus would make "
                                 "them disagree with what the rollout sampled)")

    # -- derived ----------------------------------------------------------------------------------
    @property
    def policy_engine_name(self) -> str:
        """The engine of the trained roles (the planner's, by default): the model being trained."""
        return getattr(self.flow.roles, self.train_roles[0]).engine

    @property
    def adapter_roles(self) -> bool:
        """True when a role other than the planner trains: one named adapter per role, chosen per call."""
        return self.train_roles != ["planner"]

    @property
    def frozen_policy_roles(self) -> list[str]:
        """Roles that run on the trained roles' engine without being trained: they call the base model (no
        adapter), so the trained model's engine serves them too (one llama.cpp server for every role)."""
        policy = self.policy_engine_name
        return [role for role in type(self.flow.roles).model_fields
                if role not in self.train_roles and getattr(self.flow.roles, role).engine == policy]

    @property
    def role_adapters(self) -> bool:
        """True when calls on the policy engine name their adapter (`BASE_ADAPTER` for a frozen role)."""
        return self.adapter_roles or (bool(self.frozen_policy_roles) and self.lora.enabled)

    def role_learning_rate(self, role: str) -> float:
        settings = self.role_optim.get(role)  # type: ignore[call-overload]
        return settings.learning_rate if settings and settings.learning_rate else self.learning_rate

    def role_max_grad_norm(self, role: str) -> float:
        settings = self.role_optim.get(role)  # type: ignore[call-overload]
        return settings.max_grad_norm if settings and settings.max_grad_norm else self.max_grad_norm

    @property
    def policy(self) -> TransformersEngineConfig:
        engine = self.flow.engines[self.policy_engine_name]
        assert isinstance(engine, TransformersEngineConfig)
        return engine

    def rollout_flow_config(self) -> FlowConfig:
        """The flow config with the rollout overrides (max_turns, temperature, max_tokens) applied."""
        flow = self.flow.model_copy(deep=True)
        if self.max_turns is not None:
            flow.limits.max_turns = self.max_turns
        for role in self.train_roles:
            settings = self.role_optim.get(role)  # type: ignore[call-overload]
            temperature = settings.temperature if settings and settings.temperature else self.temperature
            if temperature is not None:
                getattr(flow.roles, role).sampling.temperature = temperature
        if self.planner_max_tokens is not None:
            flow.roles.planner.sampling.max_tokens = self.planner_max_tokens
        return flow

    def eval_flow_config(self) -> FlowConfig:
        flow = self.rollout_flow_config()
        for role in self.train_roles:
            getattr(flow.roles, role).sampling.temperature = self.eval_temperature
        return flow

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> TrainConfig:
        """Read a training config; `flow: FILE` names a flow config (relative to this file's folder) to train
        in, so the flow that is trained and the flow that is evaluated are one file."""
        raw = read_yaml_mapping(path)
        raw.update({k: v for k, v in overrides.items() if v is not None})
        if isinstance(raw.get("flow"), str):
            flow_path = Path(path).parent / raw["flow"]
            if not flow_path.is_file():
                raise ConfigError(f"{path}: flow file not found: {flow_path}")
            raw["flow"] = read_yaml_mapping(flow_path)
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, source: str = "config") -> TrainConfig:
        try:
            return cls.model_validate(raw)
        except ValidationError as err:
            raise ConfigError(f"{source}: {validation_message(err, cls)}") from None
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}") from None

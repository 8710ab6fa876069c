"""The config mapping: every field of ours maps onto verl, is honoured by the agent loop, or is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agentflow.errors import ConfigError
from agentflow.train.config import TrainConfig
from agentflow.verl.config import (
    AGENT_LOOP_NAME,
    ESTIMATORS,
    FIELD_ROUTES,
    NO_DUAL_CLIP,
    VerlSettings,
    VerlTrainConfig,
    agent_loop_config_path,
    verl_overrides,
    workers_concurrency,
)
from agentflow.verl.launch import load_config
from tests.verl.helpers import verl_config

EXAMPLE = Path(__file__).parents[2] / "src" / "agentflow" / "configs" / "verl_qwen7b.yaml"


def mapped(cfg: VerlTrainConfig) -> dict[str, Any]:
    return verl_overrides(cfg, train_files="train.parquet", val_files="val.parquet")


def test_every_field_has_a_route() -> None:
    """A field added to the training config must be mapped, honoured or refused here before it ships."""
    assert set(TrainConfig.model_fields) | {"verl"} == set(VerlTrainConfig.model_fields)
    assert set(VerlTrainConfig.model_fields) == set(FIELD_ROUTES)


def test_example_config_maps_the_papers_setting() -> None:
    cfg = load_config(EXAMPLE)
    o = mapped(cfg)
    assert o["trainer.use_v1"] is True
    assert o["data.train_batch_size"] == 32 and o["actor_rollout_ref.rollout.n"] == 8
    assert o["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-7B-Instruct"
    assert o["actor_rollout_ref.model.lora_rank"] == 0
    assert o["actor_rollout_ref.actor.optim.lr"] == 1e-6
    assert (o["actor_rollout_ref.actor.clip_ratio_low"], o["actor_rollout_ref.actor.clip_ratio_high"]) == (0.2, 0.28)
    assert o["actor_rollout_ref.actor.clip_ratio_c"] == NO_DUAL_CLIP
    assert o["actor_rollout_ref.actor.use_kl_loss"] is True and o["actor_rollout_ref.actor.kl_loss_coef"] == 0.001
    assert o["actor_rollout_ref.actor.kl_loss_type"] == "k3"
    assert o["actor_rollout_ref.actor.loss_agg_mode"] == "token-mean"
    assert o["data.max_prompt_length"] == 4096 and o["data.max_response_length"] == 512
    # one optimiser step per batch: a mini-batch holds B x G x max_turns rows
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] == 32 * 3
    assert o["actor_rollout_ref.actor.use_dynamic_bsz"] is True
    assert o["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 16384
    assert o["trainer.save_freq"] == 10 and o["trainer.test_freq"] == 10
    assert (o["trainer.nnodes"], o["trainer.n_gpus_per_node"]) == (1, 8)
    assert o["actor_rollout_ref.rollout.name"] == "vllm"
    assert o["actor_rollout_ref.rollout.agent.default_agent_loop"] == AGENT_LOOP_NAME
    assert o["algorithm.adv_estimator"] == "grpo" and o["algorithm.norm_adv_by_std_in_grpo"] is True
    assert o["trainer.default_local_dir"].endswith("runs/verl-qwen7b/checkpoints")
    assert o["trainer.resume_mode"] == "disable"
    assert verl_overrides(cfg, train_files="t", val_files="v", resume=True)["trainer.resume_mode"] == "auto"


def test_config_section_for_workers_round_trips_with_an_absolute_run_dir(tmp_path: Path, monkeypatch) -> None:
    from agentflow.verl.config import agentflow_section

    monkeypatch.chdir(tmp_path)
    cfg = verl_config(tmp_path, output_dir="runs/x")
    section = agentflow_section(cfg)
    assert section["output_dir"] == str(tmp_path / "runs" / "x")
    again = VerlTrainConfig.model_validate(section)
    assert again.model_dump(exclude={"output_dir"}) == cfg.model_dump(exclude={"output_dir"})


def test_agent_loop_registration_file_names_our_class() -> None:
    entries = yaml.safe_load(agent_loop_config_path().read_text())
    entry = next(e for e in entries if e["name"] == AGENT_LOOP_NAME)
    module, _, cls = entry["_target_"].rpartition(".")
    assert cls == "AgentflowAgentLoop"
    source = Path(__file__).parents[2] / "src" / Path(*module.split(".")).with_suffix(".py")
    assert f"class {cls}(" in source.read_text()


@pytest.mark.parametrize(("advantage", "estimator", "norm"), [
    ("grpo_trajectory", "grpo", True), ("no_std", "grpo", False),
    ("grpo_turn_rows", "agentflow_grpo_turn_rows", True)])
def test_advantage_estimators_map(tmp_path: Path, advantage: str, estimator: str, norm: bool) -> None:
    o = mapped(verl_config(tmp_path, advantage=advantage))
    assert (o["algorithm.adv_estimator"], o["algorithm.norm_adv_by_std_in_grpo"]) == (estimator, norm)
    assert set(ESTIMATORS) == {"grpo_trajectory", "no_std", "grpo_turn_rows"}


def test_schedule_and_evaluation_settings(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path, max_steps=50, eval_every=0, eval_size=20, eval_temperature=0.5,
                      eval_at_start=False, keep_checkpoints=4, save_every=5, seed=7, kl_coef=0.0,
                      lr_schedule="cosine", warmup_steps=3, adam_betas=[0.9, 0.95], weight_decay=0.1,
                      loss_aggregation="seq_mean_token_mean", lora={"rank": 8, "alpha": 16},
                      verl={"nnodes": 2, "n_gpus_per_node": 4, "rollout_backend": "sglang",
                            "old_logprobs": "rollout", "agent_workers": 4})
    o = mapped(cfg)
    assert o["trainer.total_training_steps"] == 50 and o["trainer.test_freq"] == 50  # start and end only
    assert o["trainer.val_before_train"] is False and o["trainer.val_only"] is False
    assert o["data.val_max_samples"] == 20
    assert o["actor_rollout_ref.rollout.val_kwargs.temperature"] == 0.5
    assert o["actor_rollout_ref.rollout.val_kwargs.do_sample"] is True
    assert o["trainer.max_actor_ckpt_to_keep"] == 4 and o["trainer.save_freq"] == 5
    assert o["data.seed"] == o["actor_rollout_ref.rollout.seed"] == 7
    assert o["actor_rollout_ref.actor.use_kl_loss"] is False
    assert o["actor_rollout_ref.actor.optim.lr_scheduler_type"] == "cosine"
    assert o["actor_rollout_ref.actor.optim.lr_warmup_steps"] == 3
    assert o["actor_rollout_ref.actor.optim.betas"] == [0.9, 0.95]
    assert o["actor_rollout_ref.actor.optim.weight_decay"] == 0.1
    assert o["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-mean"
    assert (o["actor_rollout_ref.model.lora_rank"], o["actor_rollout_ref.model.lora_alpha"]) == (8, 16)
    assert (o["trainer.nnodes"], o["trainer.n_gpus_per_node"]) == (2, 4)
    assert o["actor_rollout_ref.rollout.name"] == "sglang"
    assert o["algorithm.rollout_correction.bypass_mode"] is True
    assert o["actor_rollout_ref.rollout.temperature"] == 1.0
    assert workers_concurrency(cfg) == 64  # 256 flows over 4 workers


@pytest.mark.parametrize("raw", [{"algorithm": "frozen"}, {"max_steps": 0}])
def test_evaluation_only_runs_validate_without_training(tmp_path: Path, raw: dict[str, Any]) -> None:
    o = mapped(verl_config(tmp_path, **raw))
    assert o["trainer.val_only"] is True and o["trainer.val_before_train"] is True


def test_rollout_overrides_reach_the_servers_and_the_response_length(tmp_path: Path) -> None:
    o = mapped(verl_config(tmp_path, temperature=0.7, planner_max_tokens=200, max_turns=5))
    assert o["actor_rollout_ref.rollout.temperature"] == 0.7
    assert o["data.max_response_length"] == 200
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] == 5


def test_writing_a_default_is_never_refused(tmp_path: Path) -> None:
    cfg = verl_config(tmp_path, micro_batch_rows=8, export_gguf=False, torch_threads=None, advantage_eps=1e-6)
    assert cfg.micro_batch_rows == 8
    cfg = _with_flow(tmp_path, lambda f: f["engines"]["policy"].update(device="auto", max_batch_size=8))
    assert cfg.policy.device == "auto"


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"algorithm": "sft", "teacher": {"kind": "openai", "model": "t"}}, "single-machine baseline"),
    ({"micro_batch_rows": 4}, "micro_batch_rows"),
    ({"torch_threads": 2}, "torch_threads"),
    ({"export_gguf": True}, "export_gguf"),
    ({"sft_epochs": 3}, "sft_epochs"),
    ({"rollout_engine": {"kind": "llamacpp"}, "lora": {"enabled": True}}, "rollout_engine"),
    ({"lr_schedule": "linear"}, "linear"),
    ({"data": {"stratify_field": "kind"}}, "stratify_field"),
    ({"action_entropy_coef": 0.01}, "action_entropy_coef"),
    ({"action_entropy_target": 0.0}, "action_entropy_target"),
    ({"action_loss_share": 0.5}, "action_loss_share"),
    ({"action_logprob": "tool"}, "action_logprob"),
    ({"advantage": "batch_trajectory"}, "no verl mapping"),
    ({"advantage_eps": 1e-4}, "advantage_eps"),
    ({"lora": {"dropout": 0.1}}, "dropout"),
    ({"planner": {"seed": 3}}, "seed"),
    ({"micro_batch_tokens": 1000}, "must hold the longest row"),
    ({"verl": {"overrides": ["actor_rollout_ref.rollout.n=4"]}}, "already maps"),
    ({"verl": {"overrides": ["trainer.save_freq"]}}, "key=value"),
    ({"verl": {"unknown": 1}}, "unknown key verl.unknown"),
]


@pytest.mark.parametrize(("raw", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_settings_without_a_verl_meaning_are_refused(tmp_path: Path, raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        verl_config(tmp_path, **raw)


def _with_flow(tmp_path: Path, edit) -> VerlTrainConfig:
    raw = verl_config(tmp_path).model_dump(mode="json")
    edit(raw["flow"])
    return VerlTrainConfig.from_dict(raw)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda f: f["engines"]["policy"].update(model=None), "needs `model`"),
    (lambda f: f["engines"]["policy"].update(model="/m/planner.Q4.gguf"), "GGUF"),
    (lambda f: f["engines"]["policy"].update(dtype="float32"), "bfloat16"),
    (lambda f: f["engines"]["policy"].update(max_batch_size=2), "max_batch_size"),
    (lambda f: f["engines"]["policy"].update(device="cuda:1"), "device"),
    (lambda f: f["roles"]["verifier"].update(engine="policy"), "trained policy engine"),
    (lambda f: (f["engines"].update(other={"kind": "transformers", "model": "x"}),
                f["roles"]["generator"].update(engine="other")), "transformers engine"),
], ids=["no-model", "gguf", "dtype", "max-batch", "device", "role-on-policy", "role-transformers"])
def test_flow_settings_that_cannot_run_on_verl_are_refused(tmp_path: Path, edit, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _with_flow(tmp_path, edit)


def test_cluster_settings_are_typed() -> None:
    with pytest.raises(ValueError):
        VerlSettings(rollout_backend="tgi")
    with pytest.raises(ValueError):
        VerlSettings(nnodes=0)

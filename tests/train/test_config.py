"""TrainConfig: defaults, the shipped example YAML, validation and rollout overrides."""

from pathlib import Path

import pytest

from agentflow.errors import ConfigError
from agentflow.train.config import TrainConfig

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "agentflow" / "configs"


def test_defaults_put_the_planner_on_a_transformers_policy():
    cfg = TrainConfig()
    assert cfg.policy_engine_name == "policy"
    assert cfg.policy.kind == "transformers"
    assert cfg.flow.roles.executor.engine != cfg.policy_engine_name


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("train_*.yaml")), ids=lambda p: p.name)
def test_shipped_example_configs_load(path):
    cfg = TrainConfig.from_yaml(path)
    assert cfg.max_steps >= 1


def test_overrides_from_the_command_line_win():
    cfg = TrainConfig.from_yaml(CONFIGS / "train_cpu_demo.yaml", max_steps=3, algorithm="frozen")
    assert (cfg.max_steps, cfg.algorithm) == (3, "frozen")


def test_unknown_key_is_an_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("batch_size: 2\nbatchsize: 3\n")
    with pytest.raises(ConfigError, match="batchsize"):
        TrainConfig.from_yaml(path)


def test_planner_must_run_on_a_transformers_engine():
    with pytest.raises(ConfigError, match="must be kind 'transformers'"):
        TrainConfig.from_dict({"flow": {"engines": {"default": {"kind": "llamacpp"}}}})


def test_sft_needs_a_teacher_and_advantage_must_be_registered():
    with pytest.raises(ConfigError, match="needs a `teacher`"):
        TrainConfig.from_dict({"algorithm": "sft"})
    with pytest.raises(ConfigError, match="unknown advantage estimator"):
        TrainConfig.from_dict({"advantage": "ppo"})
    with pytest.raises(ConfigError, match="planner_prefix starts the planner's reply with its tool"):
        raw = TrainConfig().model_dump()
        TrainConfig.from_dict({**raw, "planner_prefix": '{"tool_name": "', "flow": {**raw["flow"],
                                                                                  "planner_tool_last": True}})


def test_rollout_and_eval_overrides_apply_to_copies():
    cfg = TrainConfig.from_dict({"max_turns": 2, "temperature": 0.7, "planner_max_tokens": 30,
                                 "eval_temperature": 0.0})
    rollout = cfg.rollout_flow_config()
    assert rollout.limits.max_turns == 2
    assert rollout.roles.planner.sampling.temperature == 0.7
    assert rollout.roles.planner.sampling.max_tokens == 30
    assert cfg.eval_flow_config().roles.planner.sampling.temperature == 0.0
    assert cfg.flow.roles.planner.sampling.temperature == 1.0  # the config itself is untouched


def test_defaults_are_the_papers_credit_and_normalisation():
    cfg = TrainConfig()
    assert cfg.advantage == "grpo_trajectory"  # one advantage per trajectory, broadcast to its turns
    assert cfg.loss_aggregation == "trajectory_turn_token_mean"  # 1/B 1/G_q 1/T_i 1/|a|


def test_nucleus_sampling_is_refused_for_training_only():
    nucleus = {"flow": {"engines": {"policy": {"kind": "transformers"}, "default": {"kind": "llamacpp"}},
                        "roles": {"planner": {"engine": "policy", "sampling": {"top_p": 0.9}}}}}
    with pytest.raises(ConfigError, match="training needs top_p = 1"):
        TrainConfig.from_dict(nucleus)
    assert TrainConfig.from_dict({**nucleus, "algorithm": "frozen"}).algorithm == "frozen"


def test_flow_may_be_a_flow_file_beside_the_training_config(tmp_path):
    (tmp_path / "flow.yaml").write_text("engines: {policy: {kind: transformers}, helper: {kind: llamacpp}}\n"
                                        "roles: {planner: {engine: policy}, executor: {engine: helper}, "
                                        "verifier: {engine: helper}, generator: {engine: helper}, "
                                        "tools: {engine: helper}}\nplanner_stop: true\n")
    (tmp_path / "train.yaml").write_text("flow: flow.yaml\nmax_steps: 2\n")
    cfg = TrainConfig.from_yaml(tmp_path / "train.yaml")
    assert cfg.flow.planner_stop and cfg.policy_engine_name == "policy"
    (tmp_path / "bad.yaml").write_text("flow: missing.yaml\n")
    with pytest.raises(ConfigError, match="flow file not found"):
        TrainConfig.from_yaml(tmp_path / "bad.yaml")


def test_the_bonus_on_every_row_needs_a_bonus() -> None:
    with pytest.raises(ConfigError, match="action_entropy_rows: all widens"):
        TrainConfig.from_dict({"action_entropy_rows": "all"})
    config = TrainConfig.from_dict({"action_entropy_rows": "all", "action_entropy_coef": 0.01})
    assert config.action_entropy_rows == "all"
    # an adaptive weight may start at 0 and rise
    config = TrainConfig.from_dict({"action_entropy_rows": "all", "action_entropy_target": 0.6})
    assert config.action_entropy_coef == 0 and config.action_entropy_coef_step == 0.01
    with pytest.raises(ConfigError, match="action_entropy_target"):
        TrainConfig.from_dict({"action_entropy_target": -0.1})


@pytest.mark.parametrize("cost", [-0.1, 1.0])
def test_tool_call_cost_must_leave_a_right_answer_some_reward(cost):
    with pytest.raises(ConfigError, match="tool_call_cost"):
        TrainConfig.from_dict({"tool_call_cost": cost})


def test_a_group_sees_k_menu_orders_each_g_over_k_times_new_each_step():
    config = TrainConfig.from_dict({"group_shares_menu": True, "group_size": 8, "group_menu_orders": 4})
    assert config.group_variants(1) == [4, 4, 5, 5, 6, 6, 7, 7]
    assert config.group_variants(2) == [8, 8, 9, 9, 10, 10, 11, 11]
    # one order a group: the step's number, as group_shares_menu has always drawn it
    assert TrainConfig.from_dict({"group_shares_menu": True, "group_size": 8}).group_variants(3) == [3] * 8
    assert TrainConfig.from_dict({"group_size": 8}).group_variants(3) is None  # each trajectory its index


def test_menu_orders_need_a_shared_menu_and_divide_the_group():
    with pytest.raises(ConfigError, match="needs group_shares_menu"):
        TrainConfig.from_dict({"group_size": 8, "group_menu_orders": 2})
    with pytest.raises(ConfigError, match="does not divide group_size 8"):
        TrainConfig.from_dict({"group_shares_menu": True, "group_size": 8, "group_menu_orders": 3})

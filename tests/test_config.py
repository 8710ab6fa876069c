"""Flow configuration: shipped examples load, mistakes are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentflow
from agentflow.config import FlowConfig
from agentflow.errors import ConfigError

CONFIGS = Path(agentflow.__file__).parent / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("flow_*.yaml")))
def test_shipped_flow_configs_load(name):
    config = FlowConfig.from_yaml(CONFIGS / name)
    assert config.roles.planner.engine in config.engines


@pytest.mark.parametrize("name", ["flow_mixed.yaml", "flow_mixed_kb.yaml"])
def test_the_mixed_flows_are_the_papers_and_never_cut_a_planner_reply(name):
    config = FlowConfig.from_yaml(CONFIGS / name)
    assert config.planner_stop and config.limits.max_turns >= 3
    assert not any(settings.get("input") for settings in config.tools.values())  # the executor writes every call
    assert 2 * config.limits.plan_chars + 30 <= config.roles.planner.sampling.max_tokens


def test_no_config_means_the_bundled_models_flow_and_a_named_model_gets_the_papers():
    from agentflow.cli import load_config
    from agentflow.config import bundled_flow_config

    assert load_config(None) == bundled_flow_config() == FlowConfig.from_yaml(CONFIGS / "flow_default.yaml")
    assert load_config(None, bundled=False) == FlowConfig()
    paper = FlowConfig()
    assert paper.query_analysis and paper.verify and paper.limits.max_turns == 3


def test_flow_openai_yaml_is_the_papers_flow_on_a_server():
    config = FlowConfig.from_yaml(CONFIGS / "flow_openai.yaml")
    assert config.query_analysis and config.verify and config.limits.max_turns >= 3


@pytest.mark.parametrize(("raw", "message"), [
    ({"limits": {"max_turnz": 3}}, "max_turnz"),
    ({"roles": {"planner": {"engine": "nope"}}}, "engine 'nope'"),
    ({"engines": {"default": {"kind": "vllm"}}}, "kind"),
    ({"roles": {"planner": {"sampling": {"temperature": -1}}}}, "temperature"),
    ({"tools": {}}, "no tools"),
])
def test_bad_config_is_a_clear_error(raw, message):
    with pytest.raises(ConfigError, match=message):
        FlowConfig.from_dict(raw)


def test_missing_or_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        FlowConfig.from_yaml(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("engines: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        FlowConfig.from_yaml(bad)

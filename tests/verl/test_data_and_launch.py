"""Questions -> verl rows and back; `print_config` with and without verl installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from agentflow.errors import ConfigError
from agentflow.train.data import Question
from agentflow.verl.data import question_from_row, verl_record
from agentflow.verl.launch import render_config
from tests.verl.helpers import verl_config

HAS_VERL = importlib.util.find_spec("verl") is not None
EXAMPLE = Path(__file__).parents[2] / "src" / "agentflow" / "configs" / "verl_qwen7b.yaml"


@pytest.mark.parametrize("answer", ["Paris", 24, ["Paris", "paris, France"], {"options": ["A", "B"], "answer": "B"}])
def test_row_round_trip_keeps_the_question(answer) -> None:
    q = Question(id="geo-7", question="Capital of France?", answer=answer, reward="exact_match",
                 meta={"tool": "wikipedia_search"})
    row = verl_record(q, 3)
    assert row["agent_name"] == "agentflow" and row["extra_info"]["index"] == 3
    assert row["prompt"] == [{"role": "user", "content": "Capital of France?"}]
    # verl hands the agent loop the chat as `raw_prompt` and the other columns as they are
    kwargs = {**row, "raw_prompt": row.pop("prompt")}
    assert question_from_row(kwargs) == q and question_from_row(kwargs).meta == q.meta


def test_rows_from_elsewhere_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="extra_info"):
        question_from_row({"raw_prompt": [{"role": "user", "content": "q"}], "extra_info": {"index": 0}})


def test_parquet_file_holds_one_row_per_question(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow comes with the [verl] extra")
    from agentflow.verl.data import write_parquet

    questions = [Question(id=f"q{i}", question=f"{i} + {i}?", answer=2 * i, reward="math") for i in range(3)]
    path = write_parquet(questions, tmp_path / "d" / "train.parquet")
    rows = pq.read_table(path).to_pylist()
    assert [question_from_row(r) for r in rows] == questions


@pytest.mark.skipif(HAS_VERL, reason="verl is installed: print_config shows the full config (tested below)")
def test_print_config_without_verl_shows_the_mapped_settings() -> None:
    text = render_config(EXAMPLE)
    assert "verl is not installed" in text
    shown = yaml.safe_load(text)
    assert shown["actor_rollout_ref"]["rollout"]["n"] == 8
    assert shown["trainer"]["use_v1"] is True
    assert shown["agentflow"]["group_size"] == 8


def test_print_config_reports_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("group_size: 1\n")
    with pytest.raises(ConfigError, match="group_size"):
        render_config(bad)


@pytest.mark.skipif(not HAS_VERL, reason="verl is not installed (pip install '.[verl]')")
def test_full_verl_config_passes_verls_own_validation(tmp_path: Path) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from agentflow.verl.launch import build_verl_config

    for advantage in ("grpo_trajectory", "grpo_turn_rows"):
        # LoRA off: with LoRA on, verl's check imports vLLM (GPU machines only) to validate the rank
        cfg = verl_config(tmp_path, advantage=advantage, lora={"enabled": False},
                          verl={"overrides": ["actor_rollout_ref.rollout.max_num_seqs=64"]})
        config = build_verl_config(cfg, train_file=tmp_path / "t.parquet", eval_file=tmp_path / "e.parquet")
        assert need_reference_policy(config) and not need_critic(config)
        validate_config(config, use_reference_policy=True, use_critic=False)
        actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
        actor.validate(8, config.data.train_batch_size)
        rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
        assert rollout.n == cfg.group_size and rollout.max_num_seqs == 64
        assert rollout.prompt_length == cfg.verl.max_prompt_length and rollout.response_length == 64
        assert config.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == "agentflow.verl.plugin"
        assert OmegaConf.to_container(config.agentflow)["group_size"] == cfg.group_size
    text = render_config(EXAMPLE)
    assert "agent_loop_config_path" in text and "use_v1: true" in text


def test_cli_print_config_and_convert(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agentflow.verl.cli import verl_app

    runner = CliRunner()
    result = runner.invoke(verl_app, ["print-config", "--config", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "default_agent_loop: agentflow" in result.output and "group_size: 8" in result.output
    result = runner.invoke(verl_app, ["convert", str(tmp_path / "missing"), str(tmp_path / "out")])
    assert result.exit_code == 2 and "checkpoint not found" in result.output


@pytest.mark.skipif(not HAS_VERL, reason="verl is not installed (pip install '.[verl]')")
def test_launch_writes_data_and_config_then_calls_verls_runner(tmp_path: Path, monkeypatch) -> None:
    import verl.trainer.main_ppo as main_ppo
    from omegaconf import OmegaConf

    from agentflow.verl.launch import launch

    calls = []
    monkeypatch.setattr(main_ppo, "run_ppo",
                        lambda config, task_runner_class: calls.append((config, task_runner_class)))
    cfg = verl_config(tmp_path, lora={"enabled": False}, batch_size=4)
    path = tmp_path / "train_verl.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    launch(path, resume=True, max_steps=3)

    (config, runner_class), = calls
    assert runner_class is main_ppo.TaskRunnerV1
    run = Path(cfg.output_dir)
    assert (run / "data" / "train.parquet").is_file() and (run / "data" / "heldout.parquet").is_file()
    written = OmegaConf.load(run / "verl_config.yaml")
    assert written.trainer.total_training_steps == 3 and written.trainer.resume_mode == "auto"
    assert config.data.train_files == str(run / "data" / "train.parquet")
    assert config.agentflow.max_steps == 3

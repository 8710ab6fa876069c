"""The `agentflow` command: solve and tool, through typer's runner (fast) and the real model (slow)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agentflow.cli import app

runner = CliRunner()


def test_tool_run_python_runs_code_in_the_sandbox_without_an_llm():
    result = runner.invoke(app, ["tool", "run", "python", "--input", '{"code": "print(6*7)"}'])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["output"] == "42"


@pytest.mark.parametrize(("args", "message"), [
    (["tool", "run", "python", "--input", "{not json"], "not valid JSON"),
    (["tool", "run", "python", "--input", "[1]"], "JSON object"),
])
def test_tool_run_bad_input_is_a_clear_error(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in result.output


def test_tool_run_reports_tool_errors_as_json():
    result = runner.invoke(app, ["tool", "run", "nonexistent", "--input", "{}"])
    assert result.exit_code == 1
    assert json.loads(result.output)["error"]["kind"] == "unknown_tool"
    result = runner.invoke(app, ["tool", "run", "python", "--input", '{"code": "1", "task": "2"}'])
    assert json.loads(result.output)["error"]["kind"] == "tool_input"


def test_tool_run_unconfigured_web_search_says_what_is_missing():
    result = runner.invoke(app, ["tool", "run", "web_search", "--input", '{"query": "x"}'])
    assert result.exit_code == 1 and "backend" in json.loads(result.output)["error"]["message"]


def test_tool_list_shows_every_card():
    result = runner.invoke(app, ["tool", "list", "--json"])
    names = {card["name"] for card in json.loads(result.output)}
    assert {"python", "wikipedia_search", "web_search", "base_generator"} <= names


@pytest.mark.parametrize(("args", "message"), [
    (["solve", "   "], "empty"),
    (["solve", "q", "--config", "/nonexistent.yaml"], "not found"),
    (["solve", "q", "--model", "/nonexistent/model.gguf"], "/nonexistent/model.gguf"),
    (["solve", "q", "--base-url", "http://127.0.0.1:1/v1"], "go together"),
])
def test_solve_bad_input_is_a_clear_error(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_solve_with_the_bundled_model_writes_a_trajectory(tmp_path):
    out = tmp_path / "run.json"
    result = runner.invoke(app, ["solve", "What is 4821 * 97?", "--trajectory-out", str(out), "--max-turns", "2"])
    assert result.exit_code == 0, result.output
    assert "Turn 1" in result.output and "Answer:" in result.output
    record = json.loads(out.read_text())
    assert record["format_version"] == 1 and record["question"] == "What is 4821 * 97?"
    assert 1 <= len(record["turns"]) <= 2
    assert record["roles"]["planner"]["model"].startswith("SmolLM2-135M")
    assert all(turn["tool_valid"] for turn in record["turns"])  # constrained decoding: always a real tool
    assert f"agentflow view {out}" in result.output.replace("\n", "")


def test_solve_records_every_run_and_says_how_to_view_it(tmp_path, monkeypatch):
    from agentflow.flow import Flow
    from tests.conftest import role_engine

    monkeypatch.setenv("AGENTFLOW_CACHE", str(tmp_path))
    engine = role_engine(planner=['{"tool_name": "python", "sub_goal": "multiply", "context": ""}'],
                         executor=['{"code": "print(6*7)"}'], verifier=['{"analysis": "ok", "conclusion": "STOP"}'],
                         generator=["<answer>42</answer>"])
    real = Flow.from_config
    monkeypatch.setattr(Flow, "from_config", lambda config, **kw: real(config, engines={"default": engine}))
    result = runner.invoke(app, ["solve", "What is 6 * 7?", "--tools", "python"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    (written,) = (tmp_path / "trajectories").glob("solve-*.json")
    record = json.loads(written.read_text())
    assert record["answer"] == "42" and record["turns"][0]["tool_call"]["output"] == "42"
    assert f"agentflow view {written}" in result.output


def test_train_backend_verl_print_config_needs_no_gpu():
    import agentflow

    config = f"{agentflow.__path__[0]}/configs/verl_qwen7b.yaml"
    result = runner.invoke(app, ["train", "--backend", "verl", "--config", config, "--print-config"])
    assert result.exit_code == 0, result.output
    assert "n_gpus_per_node: 8" in result.output and "use_v1: true" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["train", "--backend", "tpu"], "local or verl"),
    (["train", "--print-config"], "goes with --backend verl"),
])
def test_train_bad_backend_flags(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in result.output


def test_tool_list_with_an_unknown_tool_in_the_config_is_an_error(tmp_path):
    config = tmp_path / "flow.yaml"
    config.write_text("tools:\n  python: {}\n  calculator: {}\n")
    result = runner.invoke(app, ["tool", "list", "--config", str(config)])
    assert result.exit_code == 2 and "unknown tool(s) calculator" in result.output and "python" in result.output


def test_tool_list_never_cuts_the_names_you_type_at_80_columns():
    result = runner.invoke(app, ["tool", "list"], env={"COLUMNS": "80"})
    assert result.exit_code == 0 and max(len(line) for line in result.output.splitlines()) <= 80
    names = {card["name"] for card in json.loads(runner.invoke(app, ["tool", "list", "--json"]).output)}
    assert all(name in result.output for name in names) and "…" not in result.output


def test_an_unknown_config_key_is_one_line_naming_the_nearest_key(tmp_path):
    config = tmp_path / "flow.yaml"
    config.write_text("limits:\n  max_turn: 3\n")
    result = runner.invoke(app, ["solve", "q", "--config", str(config)])
    assert result.exit_code == 2
    message = " ".join(result.output.split())
    assert "unknown key limits.max_turn (did you mean limits.max_turns?)" in message
    assert "pydantic.dev" not in result.output and "extra_forbidden" not in result.output


def test_tool_run_leaves_token_ids_and_logprobs_out(monkeypatch):
    from agentflow.engines.scripted import ScriptedEngine

    class WithTokens(ScriptedEngine):
        async def generate(self, messages, sampling, *, json_schema=None):
            done = await super().generate(messages, sampling, json_schema=json_schema)
            return done.model_copy(update={"token_ids": [1] * 50, "logprobs": [-0.1] * 50,
                                           "prompt_token_ids": [2] * 400})

    monkeypatch.setattr("agentflow.engines.build_engine", lambda config: WithTokens(["```python\nprint(6*7)\n```"]))
    result = runner.invoke(app, ["tool", "run", "python", "--input", '{"task": "six times seven"}'])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["output"] == "42" and shown["llm_calls"][0]["completion"]["text"].startswith("```python")
    assert not {"token_ids", "logprobs", "prompt_token_ids"} & set(shown["llm_calls"][0]["completion"])


def test_solve_prints_the_failure_notes_before_the_answer(monkeypatch, tmp_path, make_flow):
    from agentflow.flow import Flow
    from tests.conftest import role_engine
    from tests.test_flow import STOP, plan

    engine = role_engine(planner=[plan("echo", sub_goal="fail")], executor=['{"query": "fail"}'],
                         verifier=[STOP], generator=["<answer>Paris</answer>"])
    flow = make_flow(engine)
    monkeypatch.setattr(Flow, "from_config", classmethod(lambda cls, config, **kw: flow))
    result = runner.invoke(app, ["solve", "Capital of France?", "--trajectory-out", str(tmp_path / "t.json")])
    assert result.exit_code == 0, result.output
    note, answer = result.output.index("tool tool: echo failed on purpose"), result.output.index("Answer: Paris")
    assert note < answer < result.output.index("turn(s), stop:")


def test_library_notices_stay_out_unless_verbose():
    """transformers' FutureWarning and generation-flag notices appeared inside solve and eval output."""
    import os
    import subprocess
    import sys

    code = ("import sys, warnings; from agentflow.libwarnings import quiet_libraries; "
            "quiet_libraries(verbose=sys.argv[1] == 'verbose'); "
            "from transformers.utils import logging; "
            "logging.get_logger('transformers.generation.utils').warning('generation flags are not valid: top_k'); "
            "warnings.warn_explicit('`is_gradient_checkpointing` is deprecated', FutureWarning, 'modeling_utils.py', "
            "1, module='transformers.modeling_utils'); "
            "[None for _ in logging.tqdm(range(3), desc='Writing model shards')]")
    env = {k: v for k, v in os.environ.items()                          # other tests' quiet_libraries
           if k not in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    quiet = subprocess.run([sys.executable, "-c", code, "quiet"], capture_output=True, text=True, check=True, env=env)
    assert quiet.stderr == "" and quiet.stdout == ""
    loud = subprocess.run([sys.executable, "-c", code, "verbose"], capture_output=True, text=True, check=True,
                          env=env)
    assert "generation flags" in loud.stderr and "is_gradient_checkpointing" in loud.stderr
    assert "Writing model shards" in loud.stderr


def test_tool_list_shows_a_tool_offered_under_a_name_of_the_configs_own(tmp_path):
    config = tmp_path / "flow.yaml"
    config.write_text("tools:\n  staff_directory: {tool: document_search, description: 'The staff directory.'}\n"
                      "  notes: {tool: calculator}\n")
    result = runner.invoke(app, ["tool", "list", "--config", str(config)])
    assert result.exit_code == 2 and "unknown tool(s) notes" in result.output
    config.write_text("tools:\n  staff_directory: {tool: document_search, description: 'The staff directory.'}\n")
    result = runner.invoke(app, ["tool", "list", "--json", "--config", str(config)])
    cards = {card["name"]: card for card in json.loads(result.output)}
    assert cards["staff_directory"]["description"] == "The staff directory." and "document_search" in cards

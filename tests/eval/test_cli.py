"""`agentflow eval` command line: a benchmark name is the default command, `compare` and `list` are subcommands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agentflow.eval.cli import eval_app

AGENT = "tests.eval.fake_agents:slow_agent"

# Mounted the way the main `agentflow` app mounts it.
parent = typer.Typer()
parent.add_typer(eval_app, name="eval")


@parent.command()
def version() -> None:
    """A second command, so that `eval` stays a named group of the parent."""


runner = CliRunner()


@pytest.fixture(autouse=True)
def fast_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTFLOW_TEST_DELAY", "0")


def results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("form", [
    ["eval", "bamboogle"],                        # benchmark name as the default command
    ["eval", "run", "bamboogle"],                 # explicit subcommand
    ["eval", "--limit", "2", "bamboogle"],        # options before the benchmark
])
def test_benchmark_forms(tmp_path: Path, form: list[str]) -> None:
    args = [*form, "--out", str(tmp_path / "out"), "--agent", AGENT]
    if "--limit" not in form:
        args += ["--limit", "2"]
    result = runner.invoke(parent, args)
    assert result.exit_code == 0, result.output
    assert [r["id"] for r in results(tmp_path / "out")] == ["bamboogle:0:0", "bamboogle:1:1"]
    assert "bamboogle" in result.output and "acc." in result.output


def test_several_benchmarks_and_compare(tmp_path: Path) -> None:
    for name in ("a", "b"):
        result = runner.invoke(parent, ["eval", "aime24", "medqa", "--limit", "2", "--concurrency", "2",
                                        "--out", str(tmp_path / name), "--agent", AGENT])
        assert result.exit_code == 0, result.output
    result = runner.invoke(parent, ["eval", "compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "aime24" in result.output and "medqa" in result.output


def test_list(tmp_path: Path) -> None:
    result = runner.invoke(parent, ["eval", "list"])
    assert result.exit_code == 0
    assert "gameof24" in result.output and "--data PATH" in result.output and "multiple_choice" in result.output


def test_help_lists_the_subcommands() -> None:
    result = runner.invoke(parent, ["eval", "--help"])
    assert result.exit_code == 0
    assert "compare" in result.output and "run" in result.output


def test_missing_gaia_data_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(parent, ["eval", "gaia", "--out", str(tmp_path / "out"), "--agent", AGENT])
    assert result.exit_code == 2
    assert "gaia-benchmark/GAIA" in result.output and "--data" in result.output
    assert not (tmp_path / "out").exists()


def test_changed_config_is_refused_with_a_message(tmp_path: Path) -> None:
    out = ["--out", str(tmp_path / "out"), "--agent", AGENT, "--limit", "1"]
    assert runner.invoke(parent, ["eval", "amc23", *out]).exit_code == 0
    config = tmp_path / "flow.yaml"
    config.write_text("limits:\n  max_turns: 7\n")
    result = runner.invoke(parent, ["eval", "amc23", *out, "--config", str(config)])
    assert result.exit_code == 2
    assert "different configuration" in result.output and "max_turns" in result.output


def test_a_changed_tool_set_is_listed_among_the_differences(tmp_path: Path) -> None:
    """Regression (issue 19): a config without `python` was refused with "Differences:" and nothing after it."""
    out = ["--out", str(tmp_path / "out"), "--agent", AGENT, "--limit", "1"]
    assert runner.invoke(parent, ["eval", "amc23", *out]).exit_code == 0
    config = tmp_path / "flow.yaml"
    config.write_text("tools:\n  wikipedia_search: {}\n  base_generator: {}\n")
    result = runner.invoke(parent, ["eval", "amc23", *out, "--config", str(config)])
    assert result.exit_code == 2
    assert "flow.tools: removed python" in " ".join(result.output.split())

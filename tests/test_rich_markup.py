"""Text that goes through rich (help, errors, tables, the live step display) shows brackets as written.

Rich reads `[word]` as a style tag: unescaped, `pip install 'agentflow[verl]'` printed as `pip install 'agentflow'`,
and a `[/x]` in a model's reply or a path raised MarkupError. Every help text of every command is checked here,
so a new option with brackets in its help cannot regress.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from agentflow import cli
from agentflow.eval.compare import BenchComparison, render_comparison
from agentflow.eval.results import ItemError, ItemResult, summarize
from agentflow.eval.runner import render_summaries

runner = CliRunner()
HOSTILE = "[/x] [bold]b[/bold] [verl] \\[y\\]"


def normalized(text: str) -> str:
    """Help output without box drawing and with whitespace collapsed (wrapping does not matter)."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def commands(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += commands(sub, (*path, name))
    return found


def intended_brackets(text: str | None) -> list[str]:
    """The bracketed spans the reader should see: `\\[` in a help text is rich's escape for a literal `[`."""
    literal = (text or "").replace("\\[", "[")
    return [" ".join(span.split()) for span in re.findall(r"\[[^\[\]]*\]", literal)]


ALL_COMMANDS = commands(typer.main.get_command(cli.app))


@pytest.mark.parametrize("path,command", ALL_COMMANDS, ids=[" ".join(p) or "agentflow" for p, _ in ALL_COMMANDS])
def test_help_shows_every_bracket_as_written(path: tuple[str, ...], command: click.Command) -> None:
    result = runner.invoke(cli.app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    shown = normalized(result.output)
    texts = [command.help, command.epilog] + [getattr(p, "help", None) for p in command.params]
    for text in texts:
        for span in intended_brackets(text):
            assert span in shown, f"`{span}` of {' '.join(path)} --help was swallowed as markup"


def test_train_help_names_the_extra_as_typed_from_the_package_index() -> None:
    shown = normalized(runner.invoke(cli.app, ["train", "--help"], env={"COLUMNS": "200"}).output)
    assert "pip install 'agentflow[verl]'" in shown
    assert "'.'" not in shown


def test_errors_show_brackets_as_written(tmp_path: Path) -> None:
    missing = tmp_path / "[/x][bold]missing[/bold].yaml"
    cases = [
        ["solve", "what?", "--config", str(missing)],
        ["tool", "run", "python", "--input", "{}", "--config", str(missing)],
        ["eval", "[red]nope[/red]", "--out", str(tmp_path / "out")],
        ["train", "--config", str(missing)],
        ["verl", "convert", str(missing), str(tmp_path / "o")],
        ["view", str(missing)],
    ]
    for args in cases:
        result = runner.invoke(cli.app, args, env={"COLUMNS": "300"})
        assert result.exit_code != 0, args
        assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), \
            f"{args}: {result.exception!r}"
        shown = normalized(result.output)
        expected = "[red]nope[/red]" if args[0] == "eval" else "[/x][bold]missing[/bold]"
        assert expected in shown, f"{args}: {result.output}"


def capture() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=300, force_terminal=False, color_system=None), buffer


def test_live_steps_show_model_text_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    console, buffer = capture()
    monkeypatch.setattr(cli, "console", console)
    printer = cli.StepPrinter()
    printer("analysis", {"text": f"analysis {HOSTILE}"})
    printer("plan", {"turn": 1, "tool": "python", "valid": True, "sub_goal": f"goal {HOSTILE}"})
    printer("tool", {"error": False, "arguments": {"code": "print([1])"}, "output": f"out {HOSTILE}"})
    printer("verdict", {"verdict": "STOP"})
    printer("answer", {"answer": f"\\[x^2\\] {HOSTILE}"})
    text = buffer.getvalue()
    for line in (f"analysis {HOSTILE}", f"goal {HOSTILE}", f"out {HOSTILE}", f"\\[x^2\\] {HOSTILE}"):
        assert line in text, text


def test_result_tables_show_names_and_reasons_as_written() -> None:
    console, buffer = capture()
    bench = "[red]b[/red]"
    results = [ItemResult(id="i1", bench=bench, index=0, status="scored", correct=True, tools={"[t]": 1}),
               ItemResult(id="[i2]", bench=bench, index=1, status="infra_error",
                          error=ItemError(kind="[k]", message=HOSTILE))]
    render_summaries(console, {bench: summarize(bench, results)})
    render_comparison(console, [BenchComparison(bench=bench, gained=["[g]"], lost=[])], "runs/[a]", "runs/[b]")
    text = buffer.getvalue()
    for expected in (bench, "[t] 1", "[k]: 1", f"[i2]: [k]: {HOSTILE}", "A = runs/[a]", "B = runs/[b]", "[g]"):
        assert expected in text, f"{expected!r} missing:\n{text}"


def test_tool_table_shows_every_card_as_written() -> None:
    result = runner.invoke(cli.app, ["tool", "list"], env={"COLUMNS": "400"})
    assert result.exit_code == 0
    from agentflow.tools.base import tool_classes

    shown = normalized(result.output)
    for cls in tool_classes().values():
        card = cls().card()
        for field in ("name", "description", "limitations"):
            for span in intended_brackets(card[field]):
                assert span in shown


@pytest.mark.slow
def test_llamacpp_server_prints_the_model_name_as_written() -> None:
    pytest.importorskip("xllamacpp")
    command = [sys.executable, "-m", "agentflow.engines.llamacpp", "--serve", "--port", "0", "--threads", "1",
               "--n-parallel", "1", "--alias", "[bold]smol[/bold]"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert first.startswith("listening on") and "(model [bold]smol[/bold])" in first, first

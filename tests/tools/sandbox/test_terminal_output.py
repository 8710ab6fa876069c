"""Finding 4: what a tool, a model or a file says reaches the terminal with every control character and bidi
control made visible: no clipboard writes (OSC 52), links (OSC 8), titles, cursor moves or reordered text."""

from __future__ import annotations

import io
import json
import logging

import pytest
from typer.testing import CliRunner

from agentflow import cli
from agentflow.terminal import SafeConsole, SafeFormatter
from agentflow.textsafe import json_terminal_safe, terminal_safe

# Each would act on a terminal: clipboard, link, window title, cursor up + erase line, C1 CSI, bidi override.
ATTACKS = {
    "osc52": "\x1b]52;c;aGFja2Vk\x07",
    "osc8": "\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\",
    "title": "\x1b]0;owned\x07",
    "cursor up + erase": "\x1b[1A\x1b[2K",
    "c1 csi": "\x9b2J",
    "bidi override": "\u202eevil",
    "bidi isolate": "\u2066x\u2069",
    "del and bell": "\x7f\x07",
}
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\u2069", "\x7f")


def test_terminal_safe_makes_every_control_visible() -> None:
    assert terminal_safe("a\x1b[1Ab\x9bc\u202ed\n\te\x7f\x00\u200f") == "a\\x1b[1Ab\\x9bc\\u202ed\n\te\\x7f\\x00\\u200f"
    assert terminal_safe("plain text, é, 漢字, emoji 🙂") == "plain text, é, 漢字, emoji 🙂"
    for attack in ATTACKS.values():
        shown = terminal_safe(attack)
        assert not any(raw in shown for raw in RAW), shown
        assert terminal_safe(shown) == shown


def test_json_stays_valid_and_inert() -> None:
    value = {"out": "".join(ATTACKS.values())}
    text = json_terminal_safe(json.dumps(value, ensure_ascii=False))
    assert not any(raw in text for raw in RAW) and json.loads(text) == value


@pytest.mark.parametrize("attack", list(ATTACKS.values()), ids=list(ATTACKS))
def test_solve_steps_print_inert_text(attack: str, monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(cli.console, "_file", screen)  # restored to None: sys.stdout again
    printer = cli.StepPrinter()
    printer("analysis", {"text": f"analysis {attack}"})
    printer("plan", {"turn": 1, "valid": True, "tool": f"python{attack}", "sub_goal": f"goal {attack}"})
    printer("tool", {"error": False, "arguments": {"code": attack}, "output": f"result {attack}"})
    printer("answer", {"answer": f"answer {attack}"})
    shown = screen.getvalue()
    assert not any(raw in shown for raw in RAW), repr(shown)
    assert "result" in shown and "answer" in shown


def test_tool_run_prints_inert_valid_json() -> None:
    code = f"print({''.join(ATTACKS.values())!r})"
    result = CliRunner().invoke(cli.app, ["tool", "run", "python", "--input", json.dumps({"code": code})])
    assert result.exit_code == 0, result.output
    assert not any(raw in result.output for raw in RAW), repr(result.output)
    assert json.loads(result.output)["output"] == "".join(ATTACKS.values())


def test_errors_print_inert_text(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(cli.err_console, "_file", screen)
    cli._fail(f"bad config {ATTACKS['osc52']}{ATTACKS['c1 csi']}")
    assert not any(raw in screen.getvalue() for raw in RAW) and "bad config" in screen.getvalue()


def test_log_lines_are_inert() -> None:
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "tool said %s", (ATTACKS["title"],), None)
    assert not any(raw in SafeFormatter().format(record) for raw in RAW)


def test_eval_progress_and_summaries_are_inert() -> None:
    from rich.progress import Progress

    from agentflow.eval import cli as eval_cli

    assert isinstance(eval_cli.console, SafeConsole) and isinstance(eval_cli.err_console, SafeConsole)
    screen = io.StringIO()
    terminal = SafeConsole(file=screen, force_terminal=True, width=100)
    with Progress(console=terminal) as progress:  # a live display: Rich moves the cursor, the text may not
        progress.add_task(f"bench {ATTACKS['osc52']}{ATTACKS['c1 csi']}{ATTACKS['bidi override']}", total=1)
    shown = screen.getvalue()
    assert "\x1b]52" not in shown and "\x9b" not in shown and "\u202e" not in shown
    assert "\\x1b]52" in shown

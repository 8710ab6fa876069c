"""Verifier verdicts, answer extraction and memory rendering."""

from __future__ import annotations

import pytest

from agentflow.generator import extract_answer
from agentflow.memory import FlowMemory, MemoryEntry, truncate
from agentflow.verifier import parse_verdict


@pytest.mark.parametrize(("text", "expected"), [
    ('{"analysis": "a", "conclusion": "STOP"}', ("STOP", True)),
    ('{"analysis": "a", "conclusion": "continue"}', ("CONTINUE", True)),
    ("Conclusion: STOP", ("STOP", True)),
    ("we could STOP but better CONTINUE", ("CONTINUE", True)),
    ("", ("CONTINUE", False)),
    ("no idea", ("CONTINUE", False)),
])
def test_parse_verdict(text, expected):
    assert parse_verdict(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Reasoning... <answer> 1859 </answer>", "1859"),
    ("<answer>a</answer> then <answer>b</answer>", "b"),
    ("cut off <answer>Georges Seur", "Georges Seur"),
    ("  plain answer \n", "plain answer"),
    ("", ""),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_truncate_marks_what_was_dropped():
    assert truncate("abcdef", 3) == "abc ... [truncated 3 chars]"
    assert truncate("abc", 3) == "abc"


def test_memory_renders_newest_steps_within_budget():
    memory = FlowMemory(question="q")
    for i in range(1, 11):
        memory.add(MemoryEntry(turn=i, sub_goal=f"goal {i}", tool="python", result="x" * 400))
    text = memory.render(token_budget=300, result_chars=200)
    assert "Step 10" in text and "Step 1:" not in text
    assert text.startswith("[") and "earlier step(s) omitted" in text
    assert "[truncated 200 chars]" in text
    assert len(memory.entries) == 10  # the full record is kept


def test_memory_shows_errors_and_always_the_newest_step():
    memory = FlowMemory(question="q")
    memory.add(MemoryEntry(turn=1, sub_goal="g", tool="python", error="ZeroDivisionError"))
    assert "error: ZeroDivisionError" in memory.render(token_budget=1, result_chars=100)

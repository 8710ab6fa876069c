"""Verifier verdicts, answer extraction and memory rendering."""

from __future__ import annotations

import json

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


def test_executor_sees_the_tools_worked_examples_as_prior_exchanges():
    from agentflow.executor import executor_messages
    from agentflow.tools.base import create_tool

    tool = create_tool("wikipedia_search", {})
    messages = executor_messages(question="What nationality was Chopin?", context="", sub_goal="find it", tool=tool)
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * len(tool.examples) + ["user"]
    for example, answer in zip(tool.examples, messages[2:-1:2], strict=True):
        assert json.loads(answer["content"]) == example.input
    assert "What nationality was Chopin?" in messages[-1]["content"]


@pytest.mark.parametrize("name", ["python", "wikipedia_search", "base_generator", "web_search"])
def test_every_worked_example_is_a_valid_executor_reply(name):
    from agentflow.tools.base import create_tool

    tool = create_tool(name, {})
    assert tool.examples
    for example in tool.examples:
        tool.parse_input(example.input)
        assert set(example.input) <= set(tool.executor_schema()["properties"])
    assert tool.card()["examples"] == [e.model_dump() for e in tool.examples]

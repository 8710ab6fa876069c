"""Verifier verdicts, answer extraction and memory rendering."""

from __future__ import annotations

import json
import time

import pytest

from agentflow.generator import extract_answer, generator_messages
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
    text = memory.render(token_budget=300, result_chars=200, text_chars=200)
    assert "Step 10" in text and "Step 1:" not in text
    assert text.startswith("[") and "earlier step(s) omitted" in text
    assert "[truncated 200 chars]" in text
    assert len(memory.entries) == 10  # the full record is kept


def test_memory_shows_errors_and_always_the_newest_step():
    memory = FlowMemory(question="q")
    memory.add(MemoryEntry(turn=1, sub_goal="g", tool="python", error="ZeroDivisionError"))
    assert "error: ZeroDivisionError" in memory.render(token_budget=1, result_chars=100, text_chars=100)


def test_generator_reads_the_newest_result_after_the_question():
    memory = FlowMemory(question="What is 3 times the atomic number of sulfur?")
    assert memory.latest(100) == ""
    memory.add(MemoryEntry(turn=1, sub_goal="Find sulfur", tool="wikipedia_search",
                           result="1. Sulfur: atomic number 16. " + "x" * 300))
    memory.add(MemoryEntry(turn=2, sub_goal="Multiply by 3", tool="python", result="48"))
    assert memory.latest(100) == "48"
    messages = generator_messages(question=memory.question, analysis="",
                                  memory=memory.render(token_budget=256, result_chars=100, text_chars=40),
                                  latest=memory.latest(100))
    prompt = messages[-1]["content"]
    assert prompt.index("Steps taken:") < prompt.index("Question: ") < prompt.index("Result of the last step: 48")
    memory.add(MemoryEntry(turn=3, sub_goal="again", tool="python", error="ZeroDivisionError"))
    assert memory.latest(100) == "error: ZeroDivisionError"
    memory.entries[-1] = MemoryEntry(turn=3, sub_goal="long", tool="python", result="y" * 500)
    assert memory.latest(100) == "y" * 100 + " ... [truncated 400 chars]"
    first = generator_messages(question="q", analysis="", memory="(no steps yet)", latest="")[-1]["content"]
    assert "Result of the last step" not in first


def test_executor_sees_the_tools_worked_examples_as_prior_exchanges():
    from agentflow.executor import executor_messages
    from agentflow.tools.base import create_tool

    tool = create_tool("wikipedia_search", {})
    messages = executor_messages(question="What nationality was Chopin?", context="", sub_goal="find it", tool=tool,
                                 text_chars=2000)
    assert [m["role"] for m in messages] == ["system"] + ["user", "assistant"] * len(tool.examples) + ["user"]
    for example, answer in zip(tool.examples, messages[2:-1:2], strict=True):
        assert json.loads(answer["content"]) == example.input
    assert "What nationality was Chopin?" in messages[-1]["content"]


def test_a_configured_example_shows_the_earlier_steps_it_used():
    from agentflow.executor import executor_messages
    from agentflow.tools.base import create_tool

    example = {"question": "What is the atomic number of helium times 6?", "sub_goal": "Multiply it by 6",
               "steps": "1. sub-goal: helium\n   result: Helium has atomic number 2.",
               "input": {"code": "print(2 * 6)"}}
    tool = create_tool("python", {"examples": [example]})
    messages = executor_messages(question="q", context="", sub_goal="g", tool=tool, text_chars=2000, steps="")
    shown = messages[1]["content"]
    assert shown.startswith("Steps so far:\n1. sub-goal: helium") and "Sub-goal: Multiply it by 6" in shown
    assert "Steps so far" not in messages[-1]["content"]  # this call had no earlier steps


@pytest.mark.parametrize("name", ["python", "wikipedia_search", "base_generator", "web_search"])
def test_every_worked_example_is_a_valid_executor_reply(name):
    from agentflow.tools.base import create_tool

    tool = create_tool(name, {})
    assert tool.examples
    for example in tool.examples:
        tool.parse_input(example.input)
        assert set(example.input) <= set(tool.executor_schema()["properties"])
    assert tool.card()["examples"] == [e.model_dump() for e in tool.examples]


# -- hostile replies (issue 11): each of these raised, blocked or flooded the prompts before ----------------

@pytest.mark.parametrize("text", ["[" * 100_000, '{"conclusion": ' * 5000, "1" * 5000, '{"conclusion": NaN}'])
def test_verdict_of_a_hostile_reply_is_an_unparsed_continue(text):
    assert parse_verdict(text) == ("CONTINUE", False)  # was RecursionError / ValueError out of json.loads


def test_arguments_nested_too_deep_for_the_record_are_no_arguments():
    from agentflow.executor import parse_arguments

    assert parse_arguments('{"query": ' + "[" * 300 + "1" + "]" * 300 + "}") is None  # parsed, then unwritable
    assert parse_arguments('{"query": ' + "7" * 5000 + "}") is None  # was ValueError


def test_a_cut_reply_is_read_up_to_the_cut_through_the_same_checks():
    from agentflow.executor import parse_cut_arguments

    assert parse_cut_arguments('{"code": "print(2009 * 544)  # 2009 * 544 is 1224') == {
        "code": "print(2009 * 544)  # 2009 * 544 is 1224"}
    assert parse_cut_arguments('Sure: {"code": "x = 1", "task": "ad') == {"code": "x = 1", "task": "ad"}
    assert parse_cut_arguments('{"code": "a\\') == {"code": "a"}  # cut inside an escape: the escape dropped
    assert parse_cut_arguments('{"code": ') == {}  # nothing of the field was written: the tool refuses {}
    assert parse_cut_arguments("no object") is None and parse_cut_arguments('["a", "b') is None
    assert parse_cut_arguments('{"query": ' + "7" * 5000) is None  # as unusable as when closed
    assert parse_cut_arguments('{"q": ' + "[" * 5000) is None  # too deep: None, not RecursionError


def test_repeated_answer_tags_are_parsed_in_linear_time():
    start = time.perf_counter()
    assert extract_answer("<answer>" * 20_000 + "x") == "<answer>" * 19_999 + "x"
    assert time.perf_counter() - start < 2.0  # was ~30 s: the lazy pattern rescanned from every tag


def test_memory_cuts_a_huge_sub_goal_and_tool_name_in_prompts_but_keeps_them():
    memory = FlowMemory(question="q")
    memory.add(MemoryEntry(turn=1, sub_goal="g" * 100_000, tool="t" * 100_000, result="r"))
    text = memory.render(token_budget=768, result_chars=600, text_chars=2000)
    assert len(text) < 5000 and "[truncated 98000 chars]" in text
    assert len(memory.entries[0].sub_goal) == 100_000


def test_executor_prompt_cuts_the_planners_text():
    from agentflow.executor import executor_messages
    from agentflow.tools.base import create_tool

    messages = executor_messages(question="q", context="c" * 100_000, sub_goal="g" * 100_000,
                                 tool=create_tool("wikipedia_search", {}), text_chars=500)
    assert len(messages[-1]["content"]) < 3000

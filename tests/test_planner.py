"""The planner's tolerant reply parser."""

from __future__ import annotations

import pytest

from agentflow.planner import match_tool, parse_planner_reply, planner_messages, planner_schema

TOOLS = ["python", "wikipedia_search", "web_search", "base_generator"]


def test_well_formed_json():
    step = parse_planner_reply('{"context": "c", "sub_goal": "add", "tool_name": "python"}', TOOLS)
    assert (step.context, step.sub_goal, step.tool_name, step.well_formed) == ("c", "add", "python", True)


def test_json_inside_prose_and_fences():
    text = 'Sure!\n```json\n{"Sub-Goal": "find the painter", "Tool Name": "Wikipedia_Search"}\n```'
    step = parse_planner_reply(text, TOOLS)
    assert step.tool_name == "wikipedia_search" and step.sub_goal == "find the painter"
    assert not step.well_formed  # guessed from a differently spelled name


def test_truncated_json_keeps_what_was_written():
    step = parse_planner_reply('{"context": "c", "sub_goal": "compute 12*7", "tool_name": "pyth', TOOLS)
    assert step.sub_goal == "compute 12*7" and step.tool_name == "python"


def test_line_format():
    step = parse_planner_reply("Context: none\nSub-Goal: look up Seurat\nTool Name: wikipedia_search", TOOLS)
    assert step.tool_name == "wikipedia_search" and step.sub_goal == "look up Seurat"


@pytest.mark.parametrize("text", ["", "I do not know", '{"tool_name": "Google_Search_Tool"}',
                                  "use python or wikipedia_search"])
def test_no_single_valid_tool(text):
    assert parse_planner_reply(text, TOOLS).tool_name is None


def test_single_tool_mentioned_in_prose():
    assert parse_planner_reply("I will use python to multiply.", TOOLS).tool_name == "python"


@pytest.mark.parametrize(("raw", "expected"), [("Python_Coder_Tool", "python"), ("WEB SEARCH", "web_search"),
                                               ("search", None), ("", None)])
def test_match_tool(raw, expected):
    assert match_tool(raw, TOOLS) == expected


def test_schema_restricts_tool_names_and_prompt_lists_them():
    assert planner_schema(["python"])["properties"]["tool_name"]["enum"] == ["python"]
    messages = planner_messages(question="q", analysis="", tool_descriptions={"python": "runs code"},
                                memory="(no steps yet)", turn=1, max_turns=3)
    assert "- python: runs code" in messages[1]["content"] and "Step 1 of 3" in messages[1]["content"]


def test_schema_puts_the_tool_first_so_a_cut_off_reply_still_names_one():
    schema = planner_schema(TOOLS)
    assert list(schema["properties"])[0] == "tool_name"
    step = parse_planner_reply('{"tool_name": "python", "context": "a long context that was cut o', TOOLS)
    assert step.tool_name == "python"

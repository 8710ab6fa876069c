"""benchmarks/planner_ceiling.py: the right-tool planner names the plan's tool through the reply's schema, so the
sub-goal the planner writes after it is written for that tool, at the temperature asked (0: greedy)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

from agentflow.engines.base import Completion, Engine, SamplingParams
from agentflow.planner import planner_messages, planner_schema
from agentflow.train.data import Question

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "planner_ceiling.py"
spec = importlib.util.spec_from_file_location("planner_ceiling", SCRIPT)
assert spec is not None and spec.loader is not None
ceiling = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ceiling)

TOOLS = ["answer", "python", "wikipedia_search"]


class Recorder(Engine):
    """Replies with the first tool the schema allows (what constrained decoding can only do) and a sub-goal
    naming it, and records each request's schema and temperature."""

    supports_json_schema = True

    def __init__(self) -> None:
        self.requests: list[tuple[dict | None, float]] = []

    async def generate(self, messages, sampling, *, json_schema=None) -> Completion:
        self.requests.append((json_schema, sampling.temperature))
        tool = json_schema["properties"]["tool_name"]["enum"][0] if json_schema else "python"
        return Completion(text=json.dumps({"tool_name": tool, "sub_goal": f"use {tool}", "context": ""}))


def ask(planner, question: str, turn: int, schema: dict | None) -> dict:
    messages = planner_messages(question=question, analysis="", tool_descriptions={t: t for t in TOOLS},
                                memory="", turn=turn, max_turns=3)
    completion = asyncio.run(planner.generate(messages, SamplingParams(temperature=0.7, max_tokens=64),
                                              json_schema=schema))
    return json.loads(completion.text)


def test_the_plans_tool_is_the_only_one_the_schema_allows_then_answer() -> None:
    question = Question(id="q", question="What is 7 times the atomic number of iron?", answer="182", reward="em",
                        meta={"kind": "lookup_compute", "tools": ["wikipedia_search", "python"]})
    inner = Recorder()
    planner = ceiling.RightTool(inner, [question], 0.0, stop=True)
    schema = planner_schema(TOOLS)
    replies = [ask(planner, question.question, turn, schema) for turn in (1, 2, 3)]
    assert [r["tool_name"] for r in replies] == ["wikipedia_search", "python", "answer"]
    # the sub-goal was written after the forced tool, not after another one replaced later
    assert [r["sub_goal"] for r in replies] == ["use wikipedia_search", "use python", "use answer"]
    assert [s["properties"]["tool_name"]["enum"] for s, _ in inner.requests] == [
        ["wikipedia_search"], ["python"], ["answer"]]
    assert {t for _, t in inner.requests} == {0.0}
    assert schema["properties"]["tool_name"]["enum"] == TOOLS  # the caller's schema is not changed


def test_without_a_schema_the_replys_tool_is_replaced() -> None:
    question = Question(id="q", question="What is 12 * 31?", answer="372", reward="em",
                        meta={"kind": "compute", "tools": ["python"]})
    planner = ceiling.RightTool(Recorder(), [question], 0.5, stop=True, plan=lambda q: ["wikipedia_search"])
    assert ask(planner, question.question, 1, None)["tool_name"] == "wikipedia_search"


def test_oracle_question_plays_the_right_tools_with_the_question_as_every_sub_goal() -> None:
    """The ceiling at the constants' sub-goal: what only the tool choice adds."""
    question = Question(id="q", question="Multiply the atomic number of iron by 7.", answer="182", reward="em",
                        meta={"kind": "lookup_compute", "tools": ["wikipedia_search", "python"]})
    planner = ceiling.scripted([question], ceiling.right_tools, ceiling.question_sub_goal, stop=True)
    replies = [ask(planner, question.question, turn, planner_schema(TOOLS)) for turn in (1, 2, 3)]
    assert [r["tool_name"] for r in replies] == ["wikipedia_search", "python", "answer"]
    assert {r["sub_goal"] for r in replies} == {question.question}


def test_the_oracle_names_the_tasks_own_sub_goal_for_each_step() -> None:
    question = Question(id="q", question="Which extension reaches Dakes Velis?", answer="6779", reward="cover_em",
                        meta={"kind": "staff", "tools": ["staff_directory"], "sub_goals": ["Extension of Dakes Velis"]})
    planner = ceiling.scripted([question], ceiling.right_tools, ceiling.oracle_sub_goal, stop=True)
    tools = ["answer", "staff_directory", "python"]
    replies = []
    for turn in (1, 2):
        messages = planner_messages(question=question.question, analysis="", memory="", turn=turn, max_turns=3,
                                    tool_descriptions={t: t for t in tools})
        completion = asyncio.run(planner.generate(messages, SamplingParams(temperature=0.0, max_tokens=64),
                                                  json_schema=planner_schema(tools)))
        replies.append(json.loads(completion.text))
    assert [(r["tool_name"], r["sub_goal"]) for r in replies] == [
        ("staff_directory", "Extension of Dakes Velis"), ("answer", "Extension of Dakes Velis")]

"""MCP tools in the flow with the real bundled model (SmolLM2-135M on embedded llama.cpp) and the PyPI
`mcp-server-sqlite` reference server: a fact only the database holds must reach the answer."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from agentflow.config import FlowConfig
from agentflow.engines.scripted import ScriptedEngine
from agentflow.flow import Flow

pytestmark = pytest.mark.slow

QUESTION = "What is the secret code of agent falcon? It is in the agents table of the database."
SQL = "SELECT code AS secret_code FROM agents WHERE name = 'falcon'"


def agents_db(tmp_path: Path) -> Path:
    path = tmp_path / "agents.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE agents (name TEXT, code TEXT)")
        db.executemany("INSERT INTO agents VALUES (?, ?)", [("falcon", "ZX-4417"), ("heron", "QP-2290")])
    return path


def config(db: Path, **overrides) -> FlowConfig:
    sqlite_server = {"command": str(Path(sys.executable).parent / "mcp-server-sqlite"), "args": ["--db-path", str(db)],
                     "include": ["read_query", "list_tables", "describe_table"]}
    raw = {"engines": {"default": {"kind": "llamacpp", "n_parallel": 1, "n_threads": 1}},
           "limits": {"max_turns": 2, "max_seconds": 400}, "mcp_servers": {"db": sqlite_server}, **overrides}
    return FlowConfig.from_dict(raw)


async def test_a_scripted_planner_picks_the_mcp_tool_and_the_bundled_model_answers_from_its_result(tmp_path):
    """The planner is scripted (the 135M planner rarely writes SQL); the verifier and generator are the bundled
    model. The sub-goal is the SQL (`direct_tool_input`), the reference server runs it, the generator reads it."""
    raw = config(agents_db(tmp_path), tools={}, query_analysis=False, direct_tool_input=True).model_dump()
    raw["engines"]["planner"] = {"kind": "openai", "model": "scripted", "api_key_env": None}
    raw["roles"]["planner"]["engine"] = "planner"
    raw["limits"]["max_turns"] = 1
    plan = json.dumps({"tool_name": "db.read_query", "sub_goal": SQL, "context": ""})
    async with Flow.from_config(FlowConfig.from_dict(raw), engines={"planner": ScriptedEngine([plan])}) as flow:
        trajectory = await flow.asolve(QUESTION)
    assert trajectory.infrastructure_failure is None
    assert [f for f in trajectory.failures if f.stage in ("executor", "tool")] == []
    call = trajectory.turns[0].tool_call
    assert call.tool == "db.read_query" and call.arguments == {"query": SQL}
    assert "ZX-4417" in call.output and "ZX-4417" in trajectory.generator.messages[-1]["content"]
    assert "ZX-4417" in trajectory.answer, trajectory.raw_answer


async def test_the_bundled_planner_is_offered_the_mcp_tools_next_to_the_built_in_ones(tmp_path):
    """Every role on the bundled model. What it picks is its own affair (docs/tools.md reports a run); the flow
    must offer the MCP tools, keep every choice valid, and record every call."""
    flow_config = config(agents_db(tmp_path), tools={"python": {}, "wikipedia_search": {}})
    async with Flow.from_config(flow_config) as flow:
        trajectory = await flow.asolve(QUESTION)
    assert trajectory.infrastructure_failure is None, trajectory.failures
    assert {"db.read_query", "db.list_tables", "python"} <= set(trajectory.tools)
    assert "db.read_query" in trajectory.turns[0].planner.messages[-1]["content"]
    for turn in trajectory.turns:
        assert turn.tool_valid and turn.tool_call is not None
        assert turn.tool_call.output or turn.tool_call.error is not None

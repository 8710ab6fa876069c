"""Whole flows on scripted engines whose every role replies from `strategies.replies`, and what must hold after.

`check_case` runs one question through the real `Flow` and returns the broken guarantees (empty when all hold):
no exception out of `asolve`; the question's time limit holds (no parser blocks the event loop); the trajectory
writes and reloads to an equal record; every prompt of the flow's own roles is bounded whatever the replies.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hypothesis import strategies as st
from pydantic import BaseModel

from agentflow.config import FlowConfig
from agentflow.flow import Flow
from agentflow.tools.base import Tool, ToolContext, ToolResult
from agentflow.trajectory import Trajectory
from tests.conftest import AskTool, EchoTool, role_engine
from tests.fuzz.strategies import ANY_CHAR, replies

ROLES = ("analysis", "planner", "executor", "verifier", "generator", "tools")
TOOL_NAMES = ["echo", "ask", "typed"]
MAX_SECONDS = 20.0
"""The question's time limit in these flows; a case that takes longer was blocked by a parser."""
PROMPT_CHARS = 20_000
"""Bound on one prompt of the flow's roles: the defaults' memory budget and cuts come to well under 10,000."""


class TypedInput(BaseModel):
    count: int
    weights: list[float] = []
    mode: Literal["fast", "slow"] = "fast"


class TypedTool(Tool):
    """A tool whose input has numbers, a list and an enum, so hostile arguments meet real validation."""

    name = "typed"
    description = "Counts."
    input_model = TypedInput
    output_description = "The count."

    async def run(self, args: TypedInput, ctx: ToolContext) -> ToolResult:
        return ToolResult(output=f"{args.mode} count {args.count} over {len(args.weights)} weights",
                          data={"count": args.count, "weights": args.weights})


@dataclass
class FlowCase:
    question: str
    scripts: dict[str, list[str]]
    query_analysis: bool
    direct_tool_input: bool


def role_replies(role: str, hostile: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A role's reply: hostile text, or the well-formed shape of that role with hostile values inside."""
    shaped = {
        "planner": st.builds(lambda tool, goal, ctx: json.dumps({"tool_name": tool, "sub_goal": goal, "context": ctx}),
                             st.sampled_from(TOOL_NAMES), hostile, hostile),
        "executor": st.one_of(st.builds(lambda q: json.dumps({"query": q}), hostile),
                              st.builds(lambda c, w: json.dumps({"count": c, "weights": w}), st.integers(),
                                        st.lists(st.floats(allow_nan=False), max_size=3))),
        "verifier": st.builds(lambda a, c: json.dumps({"analysis": a, "conclusion": c}), hostile,
                              st.sampled_from(["STOP", "CONTINUE"])),
        "generator": st.builds(lambda a: f"<answer>{a}</answer>", hostile),
    }
    return st.one_of(hostile, shaped[role]) if role in shaped else hostile


def flow_cases(**reply_bounds: int | bool) -> st.SearchStrategy[FlowCase]:
    hostile = replies(**reply_bounds)  # type: ignore[arg-type]
    scripts = st.fixed_dictionaries({role: st.lists(role_replies(role, hostile), min_size=1, max_size=2)
                                     for role in ROLES})
    question = st.text(ANY_CHAR, min_size=1, max_size=60).filter(str.strip)
    return st.builds(FlowCase, question, scripts, st.booleans(), st.booleans())


def build_flow(case: FlowCase) -> Flow:
    tools: list[Tool] = [EchoTool(), AskTool(), TypedTool()]
    config = FlowConfig.from_dict({
        "tools": {t.name: {} for t in tools}, "query_analysis": case.query_analysis,
        "direct_tool_input": case.direct_tool_input,
        "limits": {"max_turns": 3, "max_seconds": MAX_SECONDS, "tool_timeout_s": 2.0}})
    return Flow.from_config(config, engines={"default": role_engine(**case.scripts)},
                            tools={t.name: t for t in tools})


def check_case(case: FlowCase, loop: asyncio.AbstractEventLoop) -> list[str]:
    """Run the case; the names of the guarantees it broke."""
    start = time.perf_counter()
    try:
        traj = loop.run_until_complete(build_flow(case).asolve(case.question))
    except Exception as err:  # what the fuzz looks for: anything out of asolve
        return [f"raised {type(err).__name__}"]
    broken = []
    if time.perf_counter() - start > MAX_SECONDS:
        broken.append("blocked past the time limit")
    with tempfile.NamedTemporaryFile(suffix=".json") as file:
        path = Path(file.name)
        try:
            traj.write(path)
            reloaded = Trajectory.model_validate_json(path.read_text(encoding="utf-8"))
            if reloaded.model_dump_json() != traj.model_dump_json():
                broken.append("reloaded trajectory differs")
        except Exception as err:
            broken.append(f"trajectory not saved/reloaded: {type(err).__name__}")
    calls = [traj.analysis, traj.generator] + [c for t in traj.turns for c in (t.planner, t.executor, t.verifier)]
    longest = max((len(m["content"]) for c in calls if c is not None for m in c.messages), default=0)
    if longest > PROMPT_CHARS:
        broken.append("prompt unbounded")
    return broken

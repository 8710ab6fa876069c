"""The flow's own cost per turn, with an engine and a tool that answer instantly.

Prints a JSON summary: milliseconds of flow overhead per turn (target: under 1 ms).
Usage: python benchmarks/flow_overhead.py [--questions 200] [--turns 5] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from pydantic import BaseModel

from agentflow.config import FlowConfig
from agentflow.engines.base import Completion, Engine, SamplingParams
from agentflow.executor import EXECUTOR_SYSTEM
from agentflow.flow import Flow
from agentflow.planner import PLANNER_SYSTEM
from agentflow.tools.base import Tool, ToolContext, ToolResult
from agentflow.verifier import VERIFIER_SYSTEM

REPLIES = {
    PLANNER_SYSTEM: '{"context": "so far nothing", "sub_goal": "look up the fact", "tool_name": "lookup"}',
    EXECUTOR_SYSTEM: '{"query": "the fact"}',
    VERIFIER_SYSTEM: '{"analysis": "not yet", "conclusion": "CONTINUE"}',
}


class InstantEngine(Engine):
    supports_json_schema = True
    model_name = "instant"

    async def generate(self, messages, sampling: SamplingParams, *, json_schema=None) -> Completion:
        system = messages[0]["content"]  # the executor's system message starts with EXECUTOR_SYSTEM, then the card
        text = next((reply for prompt, reply in REPLIES.items() if system.startswith(prompt)), "<answer>42</answer>")
        return Completion(text=text, prompt_tokens=100, completion_tokens=20)


class LookupInput(BaseModel):
    query: str


class InstantTool(Tool):
    name = "lookup"
    description = "Looks a fact up."
    input_model = LookupInput
    output_description = "A fact."

    async def run(self, args: LookupInput, ctx: ToolContext) -> ToolResult:
        return ToolResult(output="The fact is forty-two. " * 20)


async def main(questions: int, turns: int, concurrency: int) -> dict:
    config = FlowConfig.from_dict({"tools": {"lookup": {}}, "limits": {"max_turns": turns}})
    flow = Flow.from_config(config, engines={"default": InstantEngine()}, tools={"lookup": InstantTool()})
    await flow.asolve("warm-up question")
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with semaphore:
            await flow.asolve(f"What is fact number {i}?")

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(questions)))
    seconds = time.perf_counter() - start
    total_turns = questions * turns
    return {"questions": questions, "turns_per_question": turns, "concurrency": concurrency,
            "seconds": round(seconds, 3), "ms_per_turn": round(1000 * seconds / total_turns, 4),
            "ms_per_question": round(1000 * seconds / questions, 3), "target_ms_per_turn": 1.0}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.questions, args.turns, args.concurrency))))

"""Wall time and tokens per question for the embedded bundled model, one at a time and concurrently.

Prints one JSON line per concurrency level. Usage:
  python benchmarks/solve_throughput.py [--questions 10] [--concurrency 1 4] [--config FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from agentflow.config import FlowConfig
from agentflow.flow import Flow

QUESTIONS = [
    "Who painted A Sunday Afternoon on the Island of La Grande Jatte, and in which year was he born?",
    "What is 4821 * 97?",
    "Who wrote Pride and Prejudice?",
    "What is the capital of Australia?",
    "What is 2 to the power of 20?",
    "Which planet is known as the Red Planet?",
    "What is the sum of the integers from 1 to 250?",
    "Who developed the theory of general relativity?",
    "What is 987654 - 123456?",
    "In which country is the city of Kyoto?",
]


async def run(flow: Flow, questions: list[str], concurrency: int) -> dict:
    semaphore = asyncio.Semaphore(concurrency)
    seconds: list[float] = []

    async def one(question: str):
        async with semaphore:
            trajectory = await flow.asolve(question)
            seconds.append(trajectory.seconds)
            return trajectory

    start = time.perf_counter()
    trajectories = await asyncio.gather(*(one(q) for q in questions))
    wall = time.perf_counter() - start
    prompt = sum(t.usage.prompt_tokens for t in trajectories)
    completion = sum(t.usage.completion_tokens for t in trajectories)
    calls = sum(t.usage.calls for t in trajectories)
    return {
        "concurrency": concurrency, "questions": len(questions), "wall_s": round(wall, 1),
        "questions_per_min": round(60 * len(questions) / wall, 2),
        "median_s_per_question": round(statistics.median(seconds), 1),
        "model_calls_per_question": round(calls / len(questions), 1),
        "prompt_tokens_per_question": round(prompt / len(questions)),
        "completion_tokens_per_question": round(completion / len(questions)),
        "turns_per_question": round(sum(len(t.turns) for t in trajectories) / len(questions), 2),
        "valid_tool_share": round(sum(t.tool_valid for tr in trajectories for t in tr.turns)
                                  / max(1, sum(len(tr.turns) for tr in trajectories)), 3),
        "infrastructure_failures": sum(t.infrastructure_failure is not None for t in trajectories),
    }


async def main(args: argparse.Namespace) -> None:
    config = FlowConfig.from_yaml(args.config) if args.config else FlowConfig()
    questions = (QUESTIONS * ((args.questions + len(QUESTIONS) - 1) // len(QUESTIONS)))[: args.questions]
    async with Flow.from_config(config) as flow:
        await flow.asolve("What is 1 + 1?")  # load the model outside the measurement
        for level in args.concurrency:
            print(json.dumps(await run(flow, questions, level)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--config", default=None)
    asyncio.run(main(parser.parse_args()))

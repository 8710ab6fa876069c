"""How long one engine takes for the calls of one recorded training step, replayed alone: where a rollout's
seconds go, engine by engine, and what a base format, a prompt layout or a slot count would change.

A training run records every call of every rollout (`DIR/rollouts/step-N.jsonl`: messages, response schema,
sampling). This replays the calls of one engine of that step through llama.cpp, in waves as the flow sends
them (the planner's turn-1 calls of all trajectories together, then turn 2, ...; the helper's executor calls
per turn, then the generator's), and prints the seconds, the prompt tokens read and those taken from
llama.cpp's prompt cache, and the tokens generated. The planner's calls are sampled at their recorded
temperature through the base without adapter (an adapter adds little arithmetic; its sampling differs from
the recorded one, so the generated tokens differ somewhat). Run it on a quiet machine.

    python benchmarks/engine_replay.py RUN/rollouts/step-000001.jsonl --role planner --base f16
    python benchmarks/engine_replay.py RUN/rollouts/step-000001.jsonl --role planner --base q8_0
    python benchmarks/engine_replay.py RUN/rollouts/step-000001.jsonl --role planner --prompt-only
    python benchmarks/engine_replay.py RUN/rollouts/step-000001.jsonl --role planner --menu-per-rollout
    python benchmarks/engine_replay.py RUN/rollouts/step-000001.jsonl --role helper --base q8_0

`--prompt-only` generates one token a call: the seconds of reading the prompts alone. `--menu-per-rollout`
gives each rollout's later planner prompts its turn-1 tool menu order (what `shuffle_tools` ordered per
rollout instead of per turn would send), to measure the prompt cache that layout would gain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import xllamacpp

from agentflow.bundled import bundled_model_path
from agentflow.config import LlamaCppEngineConfig
from agentflow.engines.base import Message, SamplingParams
from agentflow.engines.llamacpp import LlamaCppEngine
from agentflow.train.export import converted_gguf

MENU = re.compile(r"Tools:\n.*?\n\nMemory:", re.S)
ONE_OF = re.compile(r"one of: [^)]*\)")
GENERATOR_WAVE = 1_000  # after every turn


def same_menu(first: str, later: str) -> str:
    """`later` (a planner prompt) with the tool menu and its list of names as they are in `first`."""
    menu, names = MENU.search(first), ONE_OF.search(first)
    if menu is None or names is None:
        raise ValueError("a planner prompt without the flow's tool menu")
    later = MENU.sub(lambda _: menu.group(0), later)
    return ONE_OF.sub(lambda _: names.group(0), later)


def waves(records: list[dict[str, Any]], role: str, menu_per_rollout: bool) -> list[list[dict[str, Any]]]:
    """The recorded calls of `role` ("planner", or "helper": executor then generator), grouped as the flow
    sends them together: by turn, the generator's last."""
    by_wave: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        trajectory = record["trajectory"]
        turns = trajectory["turns"]
        for turn in turns:
            call = turn.get("planner" if role == "planner" else "executor")
            if call is None:
                continue
            if role == "planner" and menu_per_rollout and turn["index"] > 1:
                first = turns[0]["planner"]["messages"][-1]["content"]
                call["messages"][-1]["content"] = same_menu(first, call["messages"][-1]["content"])
            by_wave.setdefault(turn["index"], []).append(call)
        if role == "helper" and trajectory.get("generator"):
            by_wave.setdefault(GENERATOR_WAVE, []).append(trajectory["generator"])
    return [by_wave[key] for key in sorted(by_wave)]


async def replay(calls: list[list[dict[str, Any]]], *, base: str, threads: int, slots: int,
                 prompt_only: bool) -> dict[str, Any]:
    engine = LlamaCppEngine(LlamaCppEngineConfig(model_path=str(converted_gguf(bundled_model_path(), base)),
                                                 n_parallel=slots, n_threads=threads, n_ctx=2048 * slots))
    try:
        await engine.generate([Message(role="user", content="hi")], SamplingParams(max_tokens=2))  # load
        totals = {"calls": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0, "generated_tokens": 0}
        per_wave = []
        started = time.perf_counter()
        for wave in calls:
            async def one(call: dict[str, Any]) -> Any:
                recorded = call["sampling"]
                sampling = SamplingParams(temperature=recorded["temperature"], top_p=recorded["top_p"],
                                          max_tokens=1 if prompt_only else recorded["max_tokens"], seed=0)
                return await engine.generate([Message(**m) for m in call["messages"]], sampling,
                                             json_schema=call.get("response_schema"))
            wave_start = time.perf_counter()
            for completion in await asyncio.gather(*(one(call) for call in wave)):
                totals["calls"] += 1
                totals["prompt_tokens"] += completion.prompt_tokens
                totals["cached_prompt_tokens"] += completion.cached_prompt_tokens or 0
                totals["generated_tokens"] += completion.completion_tokens
            per_wave.append({"calls": len(wave), "seconds": round(time.perf_counter() - wave_start, 1)})
        seconds = time.perf_counter() - started
    finally:
        await engine.aclose()
    uncached = totals["prompt_tokens"] - totals["cached_prompt_tokens"]
    return {**totals, "seconds": round(seconds, 1), "waves": per_wave,
            "ms_per_uncached_prompt_token": round(1000 * seconds / uncached, 2) if prompt_only and uncached else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rollouts", type=Path, help="a run's rollouts/step-N.jsonl")
    parser.add_argument("--role", choices=["planner", "helper"], default="planner")
    parser.add_argument("--base", choices=["f16", "q8_0"], default="f16",
                        help="the bundled model re-written as F16 (the planner's rollout base) or Q8_0 (the helper)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--prompt-only", action="store_true")
    parser.add_argument("--menu-per-rollout", action="store_true")
    args = parser.parse_args()
    records = [json.loads(line) for line in args.rollouts.read_text().splitlines()]
    calls = waves(records, args.role, args.menu_per_rollout)
    result = asyncio.run(replay(calls, base=args.base, threads=args.threads, slots=args.slots,
                                prompt_only=args.prompt_only))
    print(json.dumps({"rollouts": str(args.rollouts), "role": args.role, "base": args.base,
                      "threads": args.threads, "slots": args.slots, "prompt_only": args.prompt_only,
                      "menu_per_rollout": args.menu_per_rollout,
                      "llamacpp_build": xllamacpp.get_system_info().strip(), **result}))


if __name__ == "__main__":
    main()

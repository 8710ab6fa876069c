"""Cost of one sandboxed run of the `python` tool, at each isolation level.

Prints a JSON summary per (level, program): median and p90 wall-clock milliseconds of `run_python_sandboxed`
over `--runs` sequential runs (after one warm-up run, which also pays the one-time checks).
Usage: python benchmarks/sandbox_cost.py [--runs 30] [--levels kernel process]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from agentflow.tools.sandbox import run_python_sandboxed

PROGRAMS = {"print(1)": "print(1)", "import numpy": "import numpy\nprint(numpy.arange(3).sum())"}


async def measure(level: str, code: str, runs: int) -> dict[str, float]:
    await run_python_sandboxed(code, isolation=level)  # type: ignore[arg-type]
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = await run_python_sandboxed(code, isolation=level, timeout_s=30.0)  # type: ignore[arg-type]
        times.append((time.perf_counter() - start) * 1000)
        if not result.ok:
            raise SystemExit(f"{level}: {code!r} failed: {result.stderr}")
    times.sort()
    return {"median_ms": round(statistics.median(times), 1), "p90_ms": round(times[int(0.9 * (len(times) - 1))], 1),
            "min_ms": round(times[0], 1)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--levels", nargs="+", default=["process", "kernel"], choices=["process", "kernel"])
    args = parser.parse_args()
    summary = {level: {name: await measure(level, code, args.runs) for name, code in PROGRAMS.items()}
               for level in args.levels}
    print(json.dumps({"runs": args.runs, "results": summary}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())

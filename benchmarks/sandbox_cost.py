"""Cost of one sandboxed run of the `python` tool, at each isolation level (and, optionally, of an older sandbox).

Prints a JSON summary per (variant, program): median, p90 and p95 wall-clock milliseconds of one run, and the mean
CPU time of the child processes per run (user + system), which depends less on other load of the machine; and the
load average before and after. The
variants run interleaved (one run of each in turn), so that the machine's load falls on all of them alike; one
warm-up run of each comes first (it also pays the one-time checks).

Usage: python benchmarks/sandbox_cost.py [--runs 30] [--before OLD_SANDBOX.py]
  --before: a module file with the earlier `run_python_sandboxed(code, timeout_s=...)`, e.g.
            git show 90634ea:src/agentflow/sandbox.py > /tmp/old_sandbox.py
  A package (the sandbox since `tools/sandbox/`) cannot be loaded beside the current one: measure it by running
  this script with the older tree first on PYTHONPATH (`git archive COMMIT src | tar -x -C /tmp/old`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import statistics
import time
from collections.abc import Awaitable, Callable

from agentflow.tools.sandbox import SandboxResult, run_python_sandboxed

PROGRAMS = {"print(1)": "print(1)", "import numpy": "import numpy\nprint(numpy.arange(3).sum())"}
Runner = Callable[[str], Awaitable[SandboxResult]]


def _level(isolation: str) -> Runner:
    return lambda code: run_python_sandboxed(code, isolation=isolation, timeout_s=30.0)  # type: ignore[arg-type]


def _older(path: str) -> Runner:
    spec = importlib.util.spec_from_file_location("older_sandbox", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda code: module.run_python_sandboxed(code, timeout_s=30.0)


def _children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000 * (usage.ru_utime + usage.ru_stime)


async def measure(variants: dict[str, Runner], code: str, runs: int) -> dict[str, dict[str, float]]:
    for run in variants.values():
        await run(code)
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu = dict.fromkeys(variants, 0.0)
    for _ in range(runs):
        for name, run in variants.items():
            cpu_before, start = _children_cpu_ms(), time.perf_counter()
            result = await run(code)
            times[name].append((time.perf_counter() - start) * 1000)
            cpu[name] += _children_cpu_ms() - cpu_before
            if not result.ok:
                raise SystemExit(f"{name}: {code!r} failed: {result.stderr}")
    summary = {}
    for name, each in times.items():
        each.sort()
        summary[name] = {"median_ms": round(statistics.median(each), 1),
                         "p90_ms": round(each[int(0.9 * (len(each) - 1))], 1),
                         "p95_ms": round(each[int(0.95 * (len(each) - 1))], 1),
                         "child_cpu_ms": round(cpu[name] / runs, 1)}
    return summary


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--before", help="module file of an earlier sandbox to measure alongside")
    args = parser.parse_args()
    variants = {"before": _older(args.before)} if args.before else {}
    variants |= {"process": _level("process"), "kernel": _level("kernel")}
    load_before = os.getloadavg()
    results = {program: await measure(variants, code, args.runs) for program, code in PROGRAMS.items()}
    print(json.dumps({"runs": args.runs, "load_average": {"before": load_before, "after": os.getloadavg()},
                      "results": results}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())

"""Hostile model replies through the real Flow (scripted engines, every role): how many cases break a guarantee.

Draws cases from the fuzz suite's strategies (`tests/fuzz`) and counts, per broken guarantee, the cases that
broke it: an exception out of `asolve` (by type), a trajectory that does not save and reload, an unbounded
prompt, a case slower than the question's time limit. Prints a JSON summary.
Usage (from the repository root): python -m benchmarks.fuzz_replies [--cases 10000] [--max-run 20000] [--seed 0]
`--max-run` bounds the repeated fragments; keep it near 2000 to measure code whose parsers are quadratic.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter

from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.fuzz.flow_cases import FlowCase, check_case, flow_cases


def measure(cases: int, max_run: int, seed_value: int) -> dict:
    loop = asyncio.new_event_loop()
    broken: Counter[str] = Counter()
    failed_cases = 0
    seconds: list[float] = []

    @seed(seed_value)
    @settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=flow_cases(max_run=max_run))
    def run(case: FlowCase) -> None:
        nonlocal failed_cases
        start = time.perf_counter()
        problems = check_case(case, loop)
        seconds.append(time.perf_counter() - start)
        broken.update(problems)
        failed_cases += bool(problems)

    start = time.perf_counter()
    run()
    wall = time.perf_counter() - start
    loop.close()
    return {"cases": len(seconds), "max_run": max_run, "seed": seed_value, "wall_seconds": round(wall, 1),
            "failed_cases": failed_cases, "failed_share": round(failed_cases / max(len(seconds), 1), 4),
            "broken": dict(broken.most_common()), "slowest_case_seconds": round(max(seconds, default=0.0), 3),
            "cases_over_1s": sum(s > 1.0 for s in seconds)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--max-run", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(measure(args.cases, args.max_run, args.seed)))

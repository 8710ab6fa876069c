"""Reply parsers on the inputs that made them quadratic or crash: seconds per call against reply length.

Each family is a reply of the given length built from one fragment; each parser gets every family. A call that
raises is reported by its exception's name; a time is the best of `--repeat` calls. Linear parsers grow about
4x from one size to the next when sizes grow 4x; the replaced ones grew 16x. Prints one JSON line per
(family, parser).
Usage: python benchmarks/parse_hostile.py [--sizes 2000,8000,32000,128000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from agentflow.executor import parse_arguments
from agentflow.generator import extract_answer
from agentflow.planner import parse_planner_reply
from agentflow.verifier import parse_verdict

FAMILIES: dict[str, Callable[[int], str]] = {
    "newlines": lambda n: "\n" * n,
    "space-newline": lambda n: " \n" * (n // 2),
    "answer-tags": lambda n: "<answer>" * (n // 8),
    "open-objects": lambda n: '{"a":' * (n // 5),
    "open-arrays": lambda n: "[" * n,
    "bracket-pairs": lambda n: "{" + "[]" * (n // 2),
    "unclosed-strings": lambda n: '{"a": [1, {"b": "' * (n // 17),
    "escaped-quotes": lambda n: '{"\\"' * (n // 4),
    "huge-integer": lambda n: '{"a": ' + "7" * (n - 7) + "}",
    "plain": lambda n: "word " * (n // 5),
}
PARSERS: dict[str, Callable[[str], object]] = {
    "planner": lambda text: parse_planner_reply(text, ["python", "wikipedia_search", "web_search"]),
    "executor": parse_arguments,
    "verifier": parse_verdict,
    "generator": extract_answer,
}


def time_call(parser: Callable[[str], object], text: str, repeat: int) -> float | str:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            parser(text)
        except Exception as err:  # what the old parsers did on some families: reported, not raised
            return type(err).__name__
        best = min(best, time.perf_counter() - start)
    return round(best, 4)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__)
    cli.add_argument("--sizes", default="2000,8000,32000,128000", help="Reply lengths in characters.")
    cli.add_argument("--repeat", type=int, default=3)
    args = cli.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    for family, build in FAMILIES.items():
        for name, parser in PARSERS.items():
            seconds = {size: time_call(parser, build(size), args.repeat) for size in sizes}
            print(json.dumps({"family": family, "parser": name, "seconds_by_length": seconds}))

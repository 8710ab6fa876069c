"""How fast `agentflow view` opens a big eval run: 10,000 items by default.

Writes a results directory shaped like `agentflow eval --out` (results.jsonl, config.json, summary.json;
realistic question, prediction and gold lengths, a tenth of them infrastructure failures), then measures, over
`--repeat` runs:
  - command to URL: `agentflow view DIR --no-open` started until it prints the URL (Python start, imports, bind);
  - first JSON: GET /api/run/0, which reads and validates every result line (and its size);
  - page: Chromium's navigation start until the summary and the first page of the item table are drawn (the
    page's own clock: the `agentflow-view:ready` performance mark);
  - open total: command to URL + page (what a user waits for);
  - live poll: GET /api/run/0?after=N when nothing changed;
  - search: typing a word in the item search until the table shows the matches.

    python benchmarks/view_load.py [--items 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
WORDS = ("river painter rocket village treaty museum planet violin harbor empire novel bridge orbit "
         "desert glacier senate theorem island").split()


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize()


def write_run(out: Path, items: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    benches = ["bamboogle", "2wiki", "hotpotqa", "musique", "gameof24"]
    with (out / "results.jsonl").open("w") as handle:
        for i in range(items):
            bench = benches[i % len(benches)]
            failed = i % 10 == 9
            record = {
                "id": f"{bench}:{i}:{i}", "bench": bench, "index": i,
                "status": "infra_error" if failed else "scored",
                "question": sentence(rng, 30) + "?", "prediction": sentence(rng, 25), "gold": [sentence(rng, 3)],
                "correct": None if failed else rng.random() < 0.4, "value": None if failed else 0.0,
                "score": {"f1": rng.random()}, "judge": None, "turns": rng.randint(1, 3),
                "tools": {rng.choice(["python", "wikipedia_search"]): 1}, "invalid_tool_turns": 0,
                "tokens": {"calls": 6, "prompt_tokens": rng.randint(800, 2000), "completion_tokens": 400},
                "seconds": rng.uniform(5, 30), "stop_reason": "verifier_stop",
                "error": {"kind": "engine_timeout", "stage": "planner", "message": "no reply in 60 s"} if failed
                else None,
                "trajectory": f"trajectories/{bench}_{i}_{i}.json", "finished_at": "2026-01-01T00:00:00+00:00"}
            handle.write(json.dumps(record) + "\n")
    (out / "config.json").write_text(json.dumps({
        "fingerprint": "benchmark", "identity": {"flow": {}, "agent": "agentflow.flow:Flow"},
        "benchmarks": {b: {"scorer": "exact_match"} for b in benches},
        "invocations": [{"started_at": "2026-01-01T00:00:00+00:00"}]}))
    (out / "summary.json").write_text(json.dumps({"written_at": "2026-01-01T00:00:01+00:00", "benchmarks": {}}))


def start_view(run: Path) -> tuple[subprocess.Popen[str], str, float]:
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", "from agentflow.cli import app; app()", "view", str(run),
                                "--no-open"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if re.match(r"http://127\.0\.0\.1:\d+/", line.strip()):
            return process, line.strip(), time.perf_counter() - start
    raise RuntimeError(f"no URL printed: {process.stderr.read() if process.stderr else ''}")


def fetch(url: str) -> tuple[float, int]:
    start = time.perf_counter()
    with urllib.request.urlopen(url) as response:
        size = len(response.read())
    return time.perf_counter() - start, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        write_run(run, args.items)
        print(f"{args.items} items, results.jsonl {(run / 'results.jsonl').stat().st_size / 1e6:.1f} MB")
        numbers: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            process, url, to_url = start_view(run)
            try:
                base = url.split("#")[0]
                first, size = fetch(base + "api/run/0")
                poll = fetch(base + f"api/run/0?after={args.items}&generation=0")[0]
            finally:
                process.terminate()
                process.wait()
            for name, value in (("command to URL (s)", to_url), ("first JSON (s)", first),
                                ("first JSON (MB)", size / 1e6), ("live poll, nothing new (s)", poll)):
                numbers.setdefault(name, []).append(value)
        if Path(CHROMIUM).exists():
            from playwright.sync_api import sync_playwright

            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                for _ in range(args.repeat):
                    page = browser.new_page(viewport={"width": 1300, "height": 900})
                    process, url, to_url = start_view(run)  # a fresh server: the page's request is a cold read
                    try:
                        page.goto(url)
                        page.wait_for_selector("body[data-ready='/run/0'] table.items tbody tr")
                        # the page's own clock: navigation start to the mark set once the table is drawn
                        drawn = page.evaluate("performance.getEntriesByName('agentflow-view:ready')[0].startTime")
                        drawn /= 1000
                        start = time.perf_counter()
                        page.fill("input[type=search]", "violin glacier")
                        while "q=violin" not in page.evaluate("location.hash"):  # set once the table is redrawn
                            page.wait_for_timeout(5)
                        search = time.perf_counter() - start
                    finally:
                        process.terminate()
                        process.wait()
                    page.close()
                    for name, value in (("page drawn (s)", drawn), ("open total: command + page (s)", to_url + drawn),
                                        ("search, 120 ms debounce included (s)", search)):
                        numbers.setdefault(name, []).append(value)
                browser.close()
        else:
            print(f"{CHROMIUM} is missing: no page numbers (apt-get install -y chromium)")
        for name, values in numbers.items():
            shown = ", ".join(f"{v:.3f}" for v in values)
            print(f"{name:40s} median {statistics.median(values):8.3f}   ({shown})")


if __name__ == "__main__":
    main()

"""Screenshots of every `agentflow view` page, for docs/view.md, taken in Debian's headless Chromium.

    python benchmarks/view_screenshots.py --eval RUN_A --eval RUN_B --train TRAIN_RUN [--out docs/view]

RUN_A and RUN_B are `agentflow eval --out` directories of the same benchmark (their comparison is shot too),
TRAIN_RUN an `agentflow train --out` directory. Which item, flipped item, step and rollout are shown is picked
from the runs' own JSON: an item that used a tool, the first flipped item, the step whose groups have the most
learning signal. Prints the file names it wrote.
"""

from __future__ import annotations

import argparse
import json
import threading
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agentflow.view.api import ViewApp
from agentflow.view.server import ViewServer

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
WIDTH, MAX_HEIGHT = 1360, 1500


def api(base: str, route: str) -> Any:
    with urllib.request.urlopen(base + "api" + route) as response:
        return json.load(response)


def pages(base: str, evals: list[int], train: int | None) -> list[tuple[str, str]]:
    """(file name, route) of each page to shoot."""
    shots: list[tuple[str, str]] = []
    if evals:
        run = api(base, f"/run/{evals[0]}")
        rows = [dict(zip(run["columns"], r, strict=True)) for r in run["rows"]]
        pick = max(rows, key=lambda r: (r["status"] == "scored", bool(r["tools"]), r["correct"] is True, -r["index"]))
        shots += [("eval-run.png", f"/run/{evals[0]}"),
                  ("trajectory.png", f"/run/{evals[0]}/item/{quote(pick['id'], safe='')}")]
    if len(evals) > 1:
        route = f"/compare/{evals[0]}/{evals[1]}"
        shots.append(("comparison.png", route))
        flipped = api(base, route)["flipped"]
        if flipped:
            shots.append(("comparison-item.png", f"{route}/item/{quote(flipped[0]['id'], safe='')}"))
    if train is not None:
        shots.append(("training-run.png", f"/train/{train}"))
        steps = api(base, f"/train/{train}")["steps"]
        if steps:
            groups = {s: api(base, f"/train/{train}/step/{s}")["groups"] for s in steps}
            step = max(steps, key=lambda s: (sum(g["signal"] for g in groups[s]), s))
            shots.append(("training-step.png", f"/train/{train}/step/{step}"))
            rollout = next((r for g in groups[step] for r in g["rollouts"] if r["has_trajectory"]), None)
            if rollout:
                shots.append(("training-rollout.png",
                              f"/train/{train}/step/{step}/rollout/{quote(rollout['id'], safe='')}"))
    return shots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval", action="append", type=Path, default=[], help="an eval run directory (twice: "
                        "also their comparison)")
    parser.add_argument("--train", type=Path, help="a training run directory")
    parser.add_argument("--out", type=Path, default=Path("docs/view"))
    args = parser.parse_args()
    paths = [*args.eval[:2], *([args.train] if args.train else [])]
    server = ViewServer(ViewApp(paths))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = server.url
    shots = pages(base, list(range(len(args.eval[:2]))), len(args.eval[:2]) if args.train else None)
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": WIDTH, "height": 900}, color_scheme="light")
        for name, route in shots:
            page.goto(base + "#" + route)
            page.wait_for_selector(f"body[data-ready='{route}']")
            page.mouse.move(0, 0)
            height = min(page.evaluate("document.documentElement.scrollHeight"), MAX_HEIGHT)
            page.set_viewport_size({"width": WIDTH, "height": height})
            page.screenshot(path=str(args.out / name))
            page.set_viewport_size({"width": WIDTH, "height": 900})
            print(args.out / name, route)
        browser.close()
    server.shutdown()


if __name__ == "__main__":
    main()

"""Kill a real `agentflow eval` process with SIGKILL mid-run, run the same command again, check the results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
N_ITEMS = 24


def eval_command() -> list[str]:
    """`agentflow eval` through the main app when it mounts the eval sub-app, else the sub-app's own entry."""
    from agentflow import cli

    if any(group.name == "eval" for group in cli.app.registered_groups):
        return [sys.executable, "-c", "from agentflow.cli import app; app()", "eval"]
    return [sys.executable, "-m", "agentflow.eval.cli"]


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_kill_9_then_rerun_gives_every_item_once(tmp_path: Path) -> None:
    bench = tmp_path / "capitals.jsonl"
    bench.write_text("".join(json.dumps({"pid": str(i), "query": f"Q{i}: capital of "
                                         f"{'France' if i % 3 else 'Peru'}?",
                                         "answer": "Paris" if i % 3 else "Lima"}) + "\n" for i in range(N_ITEMS)))
    out = tmp_path / "out"
    command = [*eval_command(), str(bench), "--out", str(out), "--concurrency", "2",
               "--agent", "tests.eval.fake_agents:slow_agent"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "AGENTFLOW_TEST_DELAY": "0.25"}
    results = out / "results.jsonl"

    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while count_lines(results) < 6 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    killed_at = count_lines(results)
    assert 6 <= killed_at < N_ITEMS
    with results.open("ab") as handle:          # and a torn line, as a kill in the middle of a write leaves
        handle.write(b'{"id": "capitals:99:99", "bench": "capi')

    env["AGENTFLOW_TEST_DELAY"] = "0.01"
    rerun = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{killed_at} done, {N_ITEMS - killed_at} to run" in rerun.stderr

    lines = results.read_text().splitlines()
    records = [json.loads(line) for line in lines]                   # every line is whole JSON
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == N_ITEMS                      # no duplicate, no loss
    assert set(ids) == {f"capitals:{i}:{i}" for i in range(N_ITEMS)}
    assert all(r["correct"] == (r["index"] % 3 != 0) for r in records)
    summary = json.loads((out / "summary.json").read_text())["benchmarks"]["capitals"]
    assert (summary["scored"], summary["correct"], summary["infra_failed"]) == (N_ITEMS, N_ITEMS * 2 // 3, 0)

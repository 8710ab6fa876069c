"""The README's quickstart: `agentflow train --config train_quickstart.yaml` runs the real flow and the real
bundled planner to the end, writes a whole run, and `agentflow view` renders it with its curves.

Reduced here (1 step, 2 held-out questions, through the same command and flags a user types); the full
quickstart (3 steps, 10 questions) is timed in docs/training.md."""

from __future__ import annotations

import base64
import gzip
import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from agentflow import cli
from agentflow.train.config import TrainConfig

QUICKSTART = Path(cli.__file__).parent / "configs" / "train_quickstart.yaml"
runner = CliRunner()


def test_the_quickstart_config_is_small_and_documented() -> None:
    config = TrainConfig.from_yaml(QUICKSTART)
    assert config.batch_size * config.group_size <= 8 and config.max_steps <= 3 and config.eval_size == 10
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "agentflow train --config src/agentflow/configs/train_quickstart.yaml --out runs/quickstart" in readme
    assert "agentflow view runs/quickstart" in readme
    assert yaml.safe_load(QUICKSTART.read_text())["output_dir"] == "runs/quickstart"


@pytest.mark.slow
def test_the_quickstart_finishes_writes_the_run_and_the_viewer_shows_it(tmp_path: Path) -> None:
    out = tmp_path / "quickstart"
    result = runner.invoke(cli.app, ["train", "--config", str(QUICKSTART), "--out", str(out), "--max-steps", "1",
                                     "--eval-size", "2"])
    assert result.exit_code == 0, result.output
    assert "held-out accuracy" in result.output and "(2 questions)" in result.output
    assert "FutureWarning" not in result.output and "generation flags" not in result.output
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward_mean" in m]
    assert [m["step"] for m in steps] == [1]
    assert {"tool/python", "tool/wikipedia_search", "tool/turn1/python", "tool/turn2/wikipedia_search"} <= set(steps[0])
    assert [m["eval/questions"] for m in metrics if "eval/questions" in m] == [2, 2]   # before and after
    rollouts = (out / "rollouts" / "step-000001.jsonl").read_text().splitlines()
    assert len(rollouts) == 2 * 4 and all(json.loads(line)["trajectory"]["turns"] for line in rollouts)
    assert len((out / "eval" / "step-0.jsonl").read_text().splitlines()) == 2
    assert len((out / "eval" / "step-1.jsonl").read_text().splitlines()) == 2
    assert (out / "final" / "adapter" / "adapter_config.json").is_file()

    report = tmp_path / "report.html"
    shown = runner.invoke(cli.app, ["view", str(out), "--export", str(report)])
    assert shown.exit_code == 0, shown.output
    bundle = json.loads(re.search(r'<script type="application/json" id="af-data">(.*?)</script>',
                                  report.read_text(), re.S).group(1))
    page = json.loads(gzip.decompress(base64.b64decode(bundle["/train/0"])))
    assert [r["step"] for r in page["metrics"] if "reward_mean" in r] == [1] and page["steps"] == [1]
    assert {e["label"] for e in page["evals"]} == {"step-0", "step-1"}
    assert "/train/0/step/1" in bundle

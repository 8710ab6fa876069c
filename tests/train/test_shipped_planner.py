"""The planner adapter shipped with the package (trained by benchmarks/learning_cpu.sh) loads over the bundled
model and does what its numbers say: on held-out questions it looks the number up first, then computes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentflow.bundled import BUNDLED_PLANNERS, resolve_adapter
from agentflow.config import FlowConfig
from agentflow.errors import ModelNotFoundError
from agentflow.flow import Flow

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "agentflow" / "configs"


def test_bundled_adapters_resolve_and_unknown_names_list_the_shipped_ones() -> None:
    assert resolve_adapter("bundled:lookup_compute") == BUNDLED_PLANNERS / "lookup_compute"
    about = json.loads((BUNDLED_PLANNERS / "lookup_compute" / "about.json").read_text())
    assert about["trained_accuracy"] > about["frozen_accuracy"] and about["held_out_questions"] >= 200
    with pytest.raises(ModelNotFoundError, match="bundled:lookup_compute"):
        resolve_adapter("bundled:nope")


@pytest.mark.slow
def test_the_shipped_planner_looks_up_then_computes_where_the_frozen_one_does_not() -> None:
    from agentflow.train.config import DataSettings
    from agentflow.train.data import default_paths, load_questions

    questions = load_questions(default_paths("lookup_compute")[1], DataSettings())[:4]

    def tools(config: str) -> list[list[str]]:
        async def run() -> list[list[str]]:
            async with Flow.from_config(FlowConfig.from_yaml(CONFIGS / config)) as flow:
                trajectories = await asyncio.gather(*(flow.asolve(q.question) for q in questions))
            return [[turn.tool for turn in t.turns] for t in trajectories]

        return asyncio.run(run())

    assert tools("flow_lookup_compute_trained.yaml") == [["wikipedia_search", "python"]] * 4
    assert tools("flow_lookup_compute.yaml") != [["wikipedia_search", "python"]] * 4

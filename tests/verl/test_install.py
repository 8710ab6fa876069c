"""The `[verl]` extra: declared as agentflow.verl.VERL_REQUIREMENTS says, resolvable, importable on CPU.

Cheap by default: the import check runs only where the extra is installed (skips otherwise); the pip
resolution check is marked slow (about 30-60 s, it asks the package index) and runs once the extra is
declared in pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentflow.verl import VERL_REQUIREMENTS

ROOT = Path(__file__).parents[2]
HAS_VERL = importlib.util.find_spec("verl") is not None


def declared_extra() -> list[str] | None:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project.get("optional-dependencies", {}).get("verl")


def _name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(requirement).name.lower()


def test_pyproject_extra_matches_the_documented_list() -> None:
    extra = declared_extra()
    if extra is None:
        pytest.skip("pyproject.toml declares no [verl] extra yet (agentflow.verl.VERL_REQUIREMENTS is the list)")
    assert sorted(extra) == sorted(VERL_REQUIREMENTS)


@pytest.mark.skipif(not HAS_VERL, reason="the [verl] extra is not installed in this environment")
def test_installed_extra_imports_on_cpu() -> None:
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement
    from packaging.version import Version
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ  # noqa: F401  (needs TransferQueue)

    import agentflow.verl.plugin  # noqa: F401  (registers our agent loop and estimator)

    assert "agentflow" in _agent_loop_registry and "agentflow_grpo_turn_rows" in ADV_ESTIMATOR_REGISTRY
    for requirement in VERL_REQUIREMENTS:
        parsed = Requirement(requirement)
        assert parsed.specifier.contains(version(parsed.name), prereleases=True), requirement
    # pip resolves a base pin on antlr4 4.13 against verl by backtracking hydra-core to 0.11, which breaks
    # verl at import: the versions verl needs must be the ones installed
    assert Version(version("hydra-core")) >= Version("1.3") and Version(version("omegaconf")) >= Version("2.2")
    # and every base requirement of verl is met (e.g. its transformers range, below agentflow's own pin)
    for requirement in requires("verl") or []:
        parsed = Requirement(requirement)
        if parsed.marker is None:
            assert parsed.specifier.contains(version(parsed.name), prereleases=True), requirement


@pytest.mark.slow
def test_extra_resolves_with_the_base_dependencies(tmp_path: Path) -> None:
    """`pip install '.[verl]'` resolves, to verl's own pins (no silent backtracking to old hydra)."""
    if declared_extra() is None:
        pytest.skip("pyproject.toml declares no [verl] extra yet")
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
         "--report", str(report), f"{ROOT}[verl]"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    chosen = {item["metadata"]["name"].lower(): item["metadata"]["version"]
              for item in json.loads(report.read_text())["install"]}
    assert chosen["verl"] == "0.9.1"
    from packaging.version import Version

    assert Version(chosen["hydra-core"]) >= Version("1.3")
    assert {_name(r) for r in VERL_REQUIREMENTS} <= set(chosen)

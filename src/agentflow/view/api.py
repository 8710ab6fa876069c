"""The JSON twin of every page: page `#/X` is drawn from `/api/X`. The server answers these routes live; the
export writes their answers into the HTML file.

Routes (ids are URL-encoded path segments):
    /                                   the sources and the page to open first
    /run/I[?after=N&generation=G]       eval run I: summaries per benchmark, item rows from line N on
    /run/I/item/ID                      one item: its result line and trajectory
    /compare/I/J                        eval runs I and J side by side per benchmark, and the flipped items
    /compare/I/J/item/ID                the item in both runs, with both trajectories
    /train/I[?after=N&generation=G]     training run I: config, metric records from line N on, steps, evaluations
    /train/I/step/S                     the rollout groups of step S
    /train/I/step/S/rollout/ID          one rollout with its trajectory
    /train/I/eval/LABEL                 one held-out evaluation
    /trajectory/I                       trajectory file I
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from agentflow.eval.compare import compare_results
from agentflow.eval.identity import config_differences
from agentflow.view.eval_run import EvalRunView, gold_text
from agentflow.view.sources import Source, TrajectoryFileView, describe, open_source, problem_of
from agentflow.view.train_run import TrainRunView


def finite(value: Any) -> Any:
    """`value` with NaN and infinities replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def dumps(payload: Any) -> str:
    """Compact JSON; a NaN (a diverged loss in metrics.jsonl) becomes null, which the page shows as a gap."""
    try:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:
        return json.dumps(finite(payload), ensure_ascii=False, separators=(",", ":"), default=str)


class NotFound(Exception):
    """A route that names no page (unknown source, item, step)."""


def segment(value: str) -> str:
    """A route segment, encoded exactly as the page's `encodeURIComponent` does."""
    return quote(value, safe="!~*'()")


class ViewApp:
    """The sources given on the command line and the answer to every route."""

    def __init__(self, paths: list[Path]) -> None:
        self.sources: list[Source] = [open_source(path) for path in paths]

    def problems(self) -> dict[Path, str]:
        """The sources that show nothing, by path, with the reason."""
        found = {}
        for source in self.sources:
            problem = problem_of(source)
            if problem is not None:
                found[source.path if isinstance(source, TrajectoryFileView) else source.directory] = problem
        return found

    def warm(self) -> None:
        """Read every run once (in a thread at start-up), so the page's first request finds them read."""
        for source in self.sources:
            if isinstance(source, EvalRunView | TrainRunView):
                source.overview()

    def home(self) -> str:
        """The page to open first: the one source, the comparison of two eval runs, or the list."""
        kinds = [s.kind for s in self.sources]
        if len(kinds) == 1:
            return {"eval": "/run/0", "train": "/train/0", "trajectory": "/trajectory/0"}[kinds[0]]
        if kinds == ["eval", "eval"]:
            return "/compare/0/1"
        return "/"

    def _source(self, index: str, kind: type) -> Any:
        if not index.isdigit() or int(index) >= len(self.sources) or not isinstance(self.sources[int(index)], kind):
            raise NotFound(f"no {kind.kind} source {index}")
        return self.sources[int(index)]

    def get(self, route: str, query: dict[str, str] | None = None) -> dict[str, Any]:
        """The JSON answer of a route; raises NotFound."""
        query = query or {}
        parts = [unquote(p) for p in route.strip("/").split("/")] if route.strip("/") else []
        after = int(query["after"]) if query.get("after", "").isdigit() else 0
        generation = int(query["generation"]) if query.get("generation", "").isdigit() else None
        match parts:
            case []:
                evals = [i for i, s in enumerate(self.sources) if s.kind == "eval"]
                return {"kind": "index", "home": self.home(),
                        "sources": [describe(i, s) for i, s in enumerate(self.sources)],
                        "comparisons": [[a, b] for a, b in zip(evals, evals[1:], strict=False)]}
            case ["run", index]:
                return self._source(index, EvalRunView).overview(after=after, generation=generation)
            case ["run", index, "item", item_id]:
                return _found(self._source(index, EvalRunView).item(item_id), item_id)
            case ["compare", a, b]:
                return self.compare(self._source(a, EvalRunView), self._source(b, EvalRunView))
            case ["compare", a, b, "item", item_id]:
                first, second = self._source(a, EvalRunView), self._source(b, EvalRunView)
                return {"kind": "compare_item", "a": first.item(item_id), "b": second.item(item_id),
                        "names": [first.directory.name, second.directory.name], "id": item_id}
            case ["train", index]:
                return self._source(index, TrainRunView).overview(after=after, generation=generation)
            case ["train", index, "step", step] if step.isdigit():
                return _found(self._source(index, TrainRunView).step(int(step)), step)
            case ["train", index, "step", step, "rollout", rollout_id] if step.isdigit():
                return _found(self._source(index, TrainRunView).rollout(int(step), rollout_id), rollout_id)
            case ["train", index, "eval", label]:
                return _found(self._source(index, TrainRunView).held_out(label), label)
            case ["trajectory", index]:
                return self._source(index, TrajectoryFileView).overview()
        raise NotFound(f"no page {route}")

    def compare(self, a: EvalRunView, b: EvalRunView) -> dict[str, Any]:
        a.refresh()
        b.refresh()
        comparisons = compare_results(dict(a.items), dict(b.items))
        flipped = []
        for c in comparisons:
            for direction, ids in (("fixed", c.gained), ("broke", c.lost)):
                for item_id in ids:
                    first, second = a.items[item_id], b.items[item_id]
                    flipped.append({"id": item_id, "bench": c.bench, "direction": direction,
                                    "question": first.question[:400], "gold": gold_text(first.gold)[:200],
                                    "a": first.prediction[:300], "b": second.prediction[:300]})
        identities = [run.config().get("identity") for run in (a, b)]
        if all(isinstance(i, dict) for i in identities):
            differences: list[str] | None = config_differences(*identities)
        else:  # a run without a readable config.json: say nothing rather than something wrong
            differences = None
        return {"kind": "compare", "names": [a.directory.name, b.directory.name],
                "paths": [str(a.directory), str(b.directory)], "config_differences": differences,
                "benchmarks": [{**c.model_dump(mode="json", exclude={"gained", "lost"}), "fixed": len(c.gained),
                                "broke": len(c.lost)} for c in comparisons],
                "flipped": flipped}

    def routes(self) -> Iterator[str]:
        """Every route a page can ask for: what the export writes."""
        yield "/"
        evals = []
        for i, source in enumerate(self.sources):
            if isinstance(source, EvalRunView):
                evals.append(i)
                source.refresh()
                yield f"/run/{i}"
                for item_id in list(source.items):
                    yield f"/run/{i}/item/{segment(item_id)}"
            elif isinstance(source, TrainRunView):
                yield f"/train/{i}"
                for step in source.overview()["steps"]:
                    yield f"/train/{i}/step/{step}"
                    for group in source.step(step)["groups"]:  # type: ignore[index]
                        for rollout in group["rollouts"]:
                            if rollout["has_trajectory"]:
                                yield f"/train/{i}/step/{step}/rollout/{segment(rollout['id'])}"
                for evaluation in source.overview()["evals"]:
                    yield f"/train/{i}/eval/{segment(evaluation['label'])}"
            else:
                yield f"/trajectory/{i}"
        for a, b in zip(evals, evals[1:], strict=False):
            yield f"/compare/{a}/{b}"
            for flip in self.compare(self.sources[a], self.sources[b])["flipped"]:  # type: ignore[arg-type]
                yield f"/compare/{a}/{b}/item/{segment(flip['id'])}"


def _found(payload: dict[str, Any] | None, what: str) -> dict[str, Any]:
    if payload is None:
        raise NotFound(f"{what} not found")
    return payload

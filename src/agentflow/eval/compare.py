"""`agentflow eval compare A B`: per-benchmark accuracy differences between two result directories, and the
items whose verdict flipped. Accuracies are compared on the items both runs scored, so a run with more items or
more failures does not look better or worse for that reason alone.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, Field
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentflow.errors import ConfigError
from agentflow.eval.results import ItemResult, ResultsLog


class BenchComparison(BaseModel):
    bench: str
    common: int = Field(0, description="Items scored in both runs.")
    a_correct: int = 0
    b_correct: int = 0
    a_accuracy: float | None = None
    b_accuracy: float | None = None
    difference: float | None = Field(None, description="b_accuracy - a_accuracy on the common items.")
    gained: list[str] = Field(default_factory=list, description="Wrong in A, right in B.")
    lost: list[str] = Field(default_factory=list, description="Right in A, wrong in B.")
    mcnemar_p: float | None = Field(None, description="Exact two-sided McNemar p-value of the flips.")
    only_a: int = Field(0, description="Items scored in A but not in B (missing or failed there).")
    only_b: int = 0


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar test: are flips one way more frequent than flips the other way?"""
    n = gained + lost
    if n == 0:
        return 1.0
    k = min(gained, lost)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def _read(directory: Path) -> dict[str, ItemResult]:
    path = directory / "results.jsonl"
    if not path.is_file():
        raise ConfigError(f"{directory} has no results.jsonl")
    return ResultsLog(path).read()


def compare_runs(a: str | Path, b: str | Path) -> list[BenchComparison]:
    """Compare two result directories benchmark by benchmark (benchmarks present in either)."""
    return compare_results(_read(Path(a)), _read(Path(b)))


def compare_results(results_a: dict[str, ItemResult], results_b: dict[str, ItemResult]) -> list[BenchComparison]:
    """Compare two runs' results (item id -> result) benchmark by benchmark."""
    benches = sorted({r.bench for r in results_a.values()} | {r.bench for r in results_b.values()})
    comparisons = []
    for bench in benches:
        scored_a = {k: r for k, r in results_a.items() if r.bench == bench and r.status == "scored"}
        scored_b = {k: r for k, r in results_b.items() if r.bench == bench and r.status == "scored"}
        common = sorted(set(scored_a) & set(scored_b), key=lambda k: scored_a[k].index)
        c = BenchComparison(bench=bench, common=len(common), only_a=len(set(scored_a) - set(scored_b)),
                            only_b=len(set(scored_b) - set(scored_a)))
        c.a_correct = sum(1 for k in common if scored_a[k].correct)
        c.b_correct = sum(1 for k in common if scored_b[k].correct)
        if common:
            c.a_accuracy, c.b_accuracy = c.a_correct / len(common), c.b_correct / len(common)
            c.difference = c.b_accuracy - c.a_accuracy
        c.gained = [k for k in common if not scored_a[k].correct and scored_b[k].correct]
        c.lost = [k for k in common if scored_a[k].correct and not scored_b[k].correct]
        c.mcnemar_p = mcnemar_exact(len(c.gained), len(c.lost)) if common else None
        comparisons.append(c)
    return comparisons


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def render_comparison(console: Console, comparisons: list[BenchComparison], a: str, b: str, *,
                      max_items: int = 20) -> None:
    table = Table(title=escape(f"A = {a}\nB = {b}"), box=box.SIMPLE_HEAD,
                  caption="n: items scored in both; fixed: wrong in A, right in B; broke: right in A, wrong in "
                          "B; p: exact McNemar test of the flips; only A/B: scored in one run only")
    for header in ("benchmark", "n", "A %", "B %", "B-A", "fixed", "broke", "p", "only A",
                   "only B"):
        table.add_column(header, justify="left" if header == "benchmark" else "right")
    for c in comparisons:
        table.add_row(escape(c.bench), str(c.common), _pct(c.a_accuracy), _pct(c.b_accuracy), _pct(c.difference, True),
                      str(len(c.gained)), str(len(c.lost)),
                      "-" if c.mcnemar_p is None else f"{c.mcnemar_p:.3g}", str(c.only_a), str(c.only_b))
    console.print(table)
    for c in comparisons:
        for label, items in (("fixed (wrong in A, right in B)", c.gained), ("broke (right in A, wrong in B)", c.lost)):
            if items:
                shown = ", ".join(items[:max_items]) + (f", ... ({len(items) - max_items} more)"
                                                       if len(items) > max_items else "")
                console.print(f"{c.bench} {label}: {shown}", highlight=False, markup=False)

"""`agentflow eval`: run benchmarks (`agentflow eval BENCH ...`), compare runs, list benchmarks and scorers.

A benchmark name is the default command, so `agentflow eval bamboogle --limit 20` and
`agentflow eval compare DIR1 DIR2` both work: the group sends any first word that is not a subcommand to `run`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from agentflow.errors import AgentFlowError
from agentflow.terminal import SafeConsole, SafeFormatter

log = logging.getLogger(__name__)

console = SafeConsole()
err_console = SafeConsole(stderr=True)


class _BenchmarkIsDefault(TyperGroup):
    """A group whose unknown first word (a benchmark name, a file path, an option) goes to the `run` command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)


eval_app = typer.Typer(
    cls=_BenchmarkIsDefault, no_args_is_help=True,
    help="Evaluate on benchmarks: `agentflow eval BENCH [BENCH ...] \\[OPTIONS]`, "
         "`agentflow eval compare DIR1 DIR2`, `agentflow eval list`.")


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


@eval_app.command("run")
def run(
    benches: Annotated[list[str], typer.Argument(
        help="Benchmark names (bamboogle, 2wiki, hotpotqa, musique, gaia, aime24, amc23, gameof24, gpqa, medqa), "
             "'all' for the eight shipped sets, or paths of JSON/JSONL/CSV files in the same layout.",
        show_default=False)],
    limit: Annotated[int | None, typer.Option(help="Only the first N items of each benchmark.", min=1)] = None,
    out: Annotated[Path | None, typer.Option(
        help="Results directory (default: runs/eval/<config fingerprint>, so the same command resumes).")] = None,
    config: Annotated[Path | None, typer.Option(help="Flow config YAML (default: offline bundled model).")] = None,
    concurrency: Annotated[int, typer.Option(help="Items solved at the same time.", min=1)] = 4,
    retry_failed: Annotated[bool, typer.Option(
        "--retry-failed", help="Also re-run items that failed for infrastructure reasons.")] = False,
    data: Annotated[Path | None, typer.Option(help="Data file of gaia or gpqa (not redistributable).")] = None,
    scorer: Annotated[str | None, typer.Option(
        help="Scorer of a benchmark file: any registered scorer (`agentflow eval list` shows them; e.g. exact_match, "
        "f1, cover_em, math, gameof24, multiple_choice); default: inferred from the file.")
    ] = None,
    judge_config: Annotated[Path | None, typer.Option(
        help="YAML of an optional LLM judge (engine + cache); its verdicts are reported beside the scores.")
    ] = None,
    agent: Annotated[str | None, typer.Option(
        help="Evaluate another agent: 'package.module:callable' taking the FlowConfig and returning an object "
             "with `async asolve(question) -> Trajectory`.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details.")] = False,
) -> None:
    """Run benchmarks; results go to DIR/results.jsonl (resumable), DIR/summary.json and DIR/trajectories/."""
    from agentflow.eval.benchmarks import BENCHMARKS
    from agentflow.eval.runner import EvalSettings, render_summaries, run_eval
    from agentflow.libwarnings import quiet_libraries

    quiet_libraries(verbose)
    handler = logging.StreamHandler()  # warnings quote models and tools: made inert even without --verbose
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    names: list[str] = []
    for bench in benches:
        names += [n for n, spec in BENCHMARKS.items() if spec.file] if bench == "all" else [bench]
    settings = EvalSettings(benches=names, limit=limit, out=out, config=config, concurrency=concurrency,
                            retry_failed=retry_failed, data=data, scorer=scorer, judge_config=judge_config,
                            agent=agent)
    try:
        report = run_eval(settings, console=err_console)
    except AgentFlowError as err:
        raise _fail(str(err)) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]: finished items are saved; run the same command to continue.")
        raise typer.Exit(130) from None
    render_summaries(console, report.summaries)
    if report.this_run.items:
        console.print(f"ran {report.this_run.items} items in {report.this_run.wall_seconds:.1f}s: "
                      f"{report.this_run.items_per_minute:.2f} items/min at concurrency {concurrency}")
    console.print(f"results: {report.out}/results.jsonl  summary: {report.out}/summary.json", highlight=False,
                  markup=False)


@eval_app.command("compare")
def compare(
    a: Annotated[Path, typer.Argument(help="First results directory (A).")],
    b: Annotated[Path, typer.Argument(help="Second results directory (B).")],
    max_items: Annotated[int, typer.Option(help="Flipped items listed per benchmark and direction.")] = 20,
) -> None:
    """Per-benchmark accuracy differences (on items both runs scored) and the items that flipped."""
    from agentflow.eval.compare import compare_runs, render_comparison

    try:
        comparisons = compare_runs(a, b)
    except AgentFlowError as err:
        raise _fail(str(err)) from None
    render_comparison(console, comparisons, str(a), str(b), max_items=max_items)


@eval_app.command("list")
def list_benchmarks() -> None:
    """The benchmarks and scorers available."""
    from agentflow.eval.benchmarks import BENCHMARKS
    from agentflow.scoring import available_scorers

    table = Table(title="benchmarks")
    for header in ("name", "scorer", "data", "description"):
        table.add_column(header)
    for spec in BENCHMARKS.values():
        table.add_row(*(escape(text) for text in (spec.name, spec.scorer, "shipped" if spec.file else "--data PATH",
                                                  spec.description)))
    console.print(table)
    scorers = Table(title="scorers")
    scorers.add_column("name")
    scorers.add_column("description")
    for name, description in available_scorers().items():
        scorers.add_row(escape(name), escape(description))
    console.print(scorers)


def main(argv: list[str] | None = None) -> Any:
    """`python -m agentflow.eval.cli ...` (the same commands as `agentflow eval ...`)."""
    return eval_app(argv)


if __name__ == "__main__":
    main()

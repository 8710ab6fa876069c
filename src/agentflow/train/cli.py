"""`agentflow train`: Flow-GRPO, the SFT and frozen baselines, and `agentflow train plot DIR`.

`train` takes options and also has a `plot` subcommand: the options live on a callback with
`invoke_without_command=True`, which runs the training only when no subcommand was named.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from agentflow.errors import AgentFlowError

console = Console()
err_console = Console(stderr=True)


def _config_fields_help() -> str:
    """Every TrainConfig field with its default and description, for `--help`."""
    from agentflow.train.config import DataSettings, LoraSettings, RoleOptimSettings, TrainConfig

    lines = ["Config fields (YAML keys; see src/agentflow/configs/train_*.yaml):", ""]
    for prefix, model in (("", TrainConfig), ("lora.", LoraSettings), ("data.", DataSettings),
                          ("role_optim.ROLE.", RoleOptimSettings)):
        for name, field in model.model_fields.items():
            default = "" if field.is_required() else f" [default: {field.get_default(call_default_factory=False)}]"
            if field.default_factory is not None:
                default = ""
            lines.append(escape(f"- {prefix}{name}: {field.description or ''}{default}"))
    return "\n\n".join(lines)


train_app = typer.Typer(help="Train the planner inside the flow (Flow-GRPO), or run its baselines.",
                        rich_markup_mode="markdown")


@train_app.callback(invoke_without_command=True, epilog=_config_fields_help())
def train(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Training config YAML.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Run directory (default: output_dir).")] = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", help="Override max_steps (0: evaluate only).")]
    = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run directory's last checkpoint.")]
    = False,
    eval_size: Annotated[int | None, typer.Option("--eval-size", min=1, help="Override eval_size: held-out "
                                                  "questions per evaluation (the first N).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Override seed (data order, sampling, "
                                             "initialisation): one run per seed.")] = None,
    algorithm: Annotated[str | None, typer.Option("--algorithm", help="grpo | sft | frozen (overrides config).")]
    = None,
    backend: Annotated[str, typer.Option("--backend", help="local: this machine (torch); verl: hand training to "
                                         "verl (Ray, FSDP, vLLM/SGLang; pip install 'agentflow\\[verl]').")] = "local",
    print_config: Annotated[bool, typer.Option("--print-config", help="With --backend verl: print the full verl "
                                               "configuration it would run, and exit (no GPU needed).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log progress details.")] = False,
) -> None:
    """Flow-GRPO: roll out G trajectories per question with the current planner, score, update, repeat.

    Writes DIR/metrics.jsonl, TensorBoard events (DIR/tensorboard), checkpoints (DIR/checkpoints), held-out
    results (DIR/eval) and the trained planner (DIR/final: adapter/, model/, planner.gguf).
    """
    if ctx.invoked_subcommand is not None:
        return
    from agentflow.libwarnings import quiet_libraries

    quiet_libraries(verbose)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if backend not in ("local", "verl"):
        err_console.print(f"[bold red]error:[/] --backend must be local or verl, not {escape(repr(backend))}")
        raise typer.Exit(2)
    if print_config and backend != "verl":
        err_console.print("[bold red]error:[/] --print-config goes with --backend verl")
        raise typer.Exit(2)
    if backend == "verl" and eval_size is not None:
        err_console.print("[bold red]error:[/] --eval-size goes with --backend local (verl evaluates through its "
                          "own trainer settings)")
        raise typer.Exit(2)
    if backend == "verl" and seed is not None:
        err_console.print("[bold red]error:[/] --seed goes with --backend local (with verl, set `seed` in the "
                          "config: it maps to verl's data and rollout seeds)")
        raise typer.Exit(2)
    if backend == "verl":
        from agentflow.verl.cli import train_on_verl

        try:
            train_on_verl(config, print_config=print_config, out=out, max_steps=max_steps, algorithm=algorithm,
                          resume=resume, console=console)
        except AgentFlowError as err:
            err_console.print(f"[bold red]error:[/] {escape(str(err))}")
            raise typer.Exit(2) from None
        return
    from agentflow.train.config import TrainConfig
    from agentflow.train.trainer import Trainer

    try:
        overrides: dict[str, Any] = {"max_steps": max_steps, "algorithm": algorithm, "eval_size": eval_size,
                                     "seed": seed}
        if config is None:
            cfg = TrainConfig.from_dict({k: v for k, v in overrides.items() if v is not None})
        else:
            cfg = TrainConfig.from_yaml(config, **overrides)
        if out is not None:
            cfg = cfg.model_copy(update={"output_dir": str(out)})
        console.print(f"[bold]agentflow train[/bold] algorithm={cfg.algorithm} steps={cfg.max_steps} "
                      f"B={cfg.batch_size} G={cfg.group_size} -> {escape(str(cfg.output_dir))}")
        final = Trainer(cfg, console=console).run(resume=resume)
    except AgentFlowError as err:
        err_console.print(f"[bold red]error:[/] {escape(str(err))}")
        raise typer.Exit(2) from None
    if "eval/accuracy_all" in final:
        console.print(f"held-out accuracy: {final['eval/accuracy_all']:.3f} "
                      f"({final.get('eval/questions', 0)} questions)")


@train_app.command("plot")
def plot(
    run_dir: Annotated[Path, typer.Argument(help="A run directory holding metrics.jsonl.")],
    out: Annotated[Path | None, typer.Option("--out", help="PNG path (default: DIR/curves.png).")] = None,
) -> None:
    """Draw the training curves of a run (reward, accuracy, held-out accuracy, KL, ...) to a PNG."""
    from agentflow.train.plot import plot_run

    try:
        path = plot_run(run_dir, out)
    except FileNotFoundError as err:
        err_console.print(f"[bold red]error:[/] {escape(str(err))}")
        raise typer.Exit(2) from None
    console.print(f"wrote {escape(str(path))}")


if __name__ == "__main__":
    train_app()

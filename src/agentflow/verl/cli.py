"""Command-line entry points of the verl backend.

- `train_on_verl(...)`: what `agentflow train --backend verl [--print-config]` calls.
- `verl_app`: a typer sub-app (`agentflow verl convert CKPT OUT`, `agentflow verl print-config -c FILE`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from agentflow.errors import AgentFlowError

console = Console()
err_console = Console(stderr=True)


def train_on_verl(config: Path | None, *, print_config: bool = False, out: Path | None = None,
                  max_steps: int | None = None, algorithm: str | None = None, resume: bool = False,
                  console: Console | None = None) -> None:
    """Print the verl configuration a run would use, or launch it. The options are the train command's."""
    from agentflow.verl import launch as verl_launch

    overrides: dict[str, Any] = {"max_steps": max_steps, "algorithm": algorithm,
                                 "output_dir": str(out) if out is not None else None}
    if print_config:
        verl_launch.print_config(config, console=console, resume=resume, **overrides)
    else:
        verl_launch.launch(config, resume=resume, **overrides)


verl_app = typer.Typer(help="Flow-GRPO on verl: print the mapped configuration, convert checkpoints.",
                       rich_markup_mode="markdown")


@verl_app.command("print-config")
def print_config_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Training config YAML (with `verl:`).")]
    = None,
) -> None:
    """Print the full verl configuration `agentflow train --backend verl` would run (no GPU needed)."""
    try:
        train_on_verl(config, print_config=True, console=console)
    except AgentFlowError as err:
        err_console.print(f"[bold red]error:[/] {escape(str(err))}")
        raise typer.Exit(2) from None


@verl_app.command("convert")
def convert_command(
    checkpoint: Annotated[Path, typer.Argument(help="Run directory, checkpoints/, global_step_N/ or actor/.")],
    out: Annotated[Path, typer.Argument(help="Output directory (a Hugging Face model).")],
) -> None:
    """Turn a verl checkpoint into a Hugging Face directory that `agentflow solve` / `eval` load."""
    from agentflow.verl.convert import convert_checkpoint

    try:
        converted = convert_checkpoint(checkpoint, out)
    except AgentFlowError as err:
        err_console.print(f"[bold red]error:[/] {escape(str(err))}")
        raise typer.Exit(2) from None
    console.print(f"converted {converted.source} -> {converted.model_dir}", markup=False)
    settings = ", ".join(f"{k}: {v}" for k, v in converted.engine_config().model_dump(exclude_defaults=True).items())
    console.print("use it as the planner's engine:", markup=False)
    console.print(f"  engines: {{planner: {{kind: transformers, {settings}}}}}", markup=False)

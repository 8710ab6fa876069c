"""The `agentflow` command: solve, tool, eval, train, view."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from agentflow.config import FlowConfig, LlamaCppEngineConfig, OpenAIEngineConfig, bundled_flow_config
from agentflow.errors import AgentFlowError, ConfigError, ToolError
from agentflow.memory import truncate
from agentflow.terminal import SafeConsole, SafeFormatter
from agentflow.textsafe import json_terminal_safe

app = typer.Typer(help="AgentFlow: a planner / executor / verifier / generator flow, trainable with Flow-GRPO.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
tool_app = typer.Typer(help="List the tools or run one directly.", no_args_is_help=True)
app.add_typer(tool_app, name="tool")


def _mount_subcommands() -> None:
    from agentflow.eval.cli import eval_app
    from agentflow.train.cli import train_app
    from agentflow.verl.cli import verl_app
    from agentflow.view.cli import view

    app.add_typer(eval_app, name="eval")
    app.add_typer(train_app, name="train")
    app.add_typer(verl_app, name="verl")
    app.command("view")(view)

console = SafeConsole()
err_console = SafeConsole(stderr=True)


def _setup_logging(verbose: bool) -> None:
    from agentflow.libwarnings import quiet_libraries

    quiet_libraries(verbose)
    level = logging.INFO if verbose else logging.WARNING
    handler = logging.StreamHandler()
    handler.setLevel(level)  # on the handler too: some libraries (bm25s) set their own loggers to DEBUG
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def load_config(path: Path | None, *, bundled: bool = True) -> FlowConfig:
    """The config file's flow settings; without one, the configuration measured best for the bundled model
    (`bundled`), or the paper's flow for a model the user names (`--model`, `--base-url`)."""
    if path:
        return FlowConfig.from_yaml(path)
    return bundled_flow_config() if bundled else FlowConfig()


def apply_overrides(config: FlowConfig, *, model: Path | None = None, base_url: str | None = None,
                    model_name: str | None = None, tools: str | None = None, max_turns: int | None = None,
                    max_seconds: float | None = None, tool_timeout: float | None = None,
                    temperature: float | None = None) -> FlowConfig:
    """Apply command-line flags on top of a config (flags win)."""
    raw = config.model_dump()
    if base_url or model_name:
        if not (base_url and model_name):
            raise ConfigError("--base-url and --model-name go together")
        raw["engines"]["default"] = OpenAIEngineConfig(base_url=base_url, model=model_name).model_dump()
    elif model:
        raw["engines"]["default"] = LlamaCppEngineConfig(model_path=str(model)).model_dump()
    if tools:
        names = [t.strip() for t in tools.split(",") if t.strip()]
        raw["tools"] = {name: raw["tools"].get(name, {}) for name in names}
    for key, value in (("max_turns", max_turns), ("max_seconds", max_seconds), ("tool_timeout_s", tool_timeout)):
        if value is not None:
            raw["limits"][key] = value
    if temperature is not None:
        for role in raw["roles"].values():
            role["sampling"]["temperature"] = temperature
    return FlowConfig.from_dict(raw, source="command line")


class StepPrinter:
    """Prints each step of a running flow as it happens. Model text is escaped: a `[/x]` in it is text, not markup."""

    def __init__(self, *, show_answer: bool = True) -> None:
        self.show_answer = show_answer  # `solve` prints the answer itself, after the failure notes

    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "analysis":
            console.print(f"[bold]Analysis[/] {escape(truncate(payload['text'], 300))}", highlight=False)
        elif kind == "plan":
            style = "cyan" if payload["valid"] else "red"
            console.print(f"\n[bold]Turn {payload['turn']}[/] tool=[{style}]{escape(payload['tool'] or '-')}[/] "
                          f"sub-goal: {escape(truncate(payload['sub_goal'], 200))}", highlight=False)
        elif kind == "tool":
            mark = "[red]error[/]" if payload["error"] else "result"
            arguments = json.dumps(payload["arguments"], ensure_ascii=False)[:200]
            console.print(f"  input {escape(arguments)}", highlight=False)
            code = payload.get("code")
            if code and code != payload["arguments"].get("code"):  # written inside the tool: show what ran
                lines = code.splitlines()
                shown = "\n".join(f"    {line}" for line in lines[:15]) + ("\n    ..." if len(lines) > 15 else "")
                console.print(f"  code written by the tool's model ({payload.get('llm_calls', 0)} call(s)):\n"
                              f"{escape(shown)}", highlight=False)
            console.print(f"  {mark}: {escape(payload['output'])}", highlight=False)
        elif kind == "verdict":
            console.print(f"  verifier: [bold]{escape(str(payload['verdict']))}[/]")
        elif kind == "answer" and self.show_answer:
            console.print(f"\n[bold green]Answer:[/] {escape(payload['answer'])}", highlight=False)


@app.command()
def solve(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML flow config.")] = None,
    trajectory_out: Annotated[Path | None, typer.Option(
        help="Write the whole trajectory record here (JSON); default: a new file under the agentflow cache "
        "(trajectories/), whose path is printed with the command that shows it.")] = None,
    model: Annotated[Path | None, typer.Option(help="GGUF file for the embedded llama.cpp engine.")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible server for every role (…/v1).")] = None,
    model_name: Annotated[str | None, typer.Option(help="Model name on that server.")] = None,
    tools: Annotated[str | None, typer.Option(help="Comma-separated tools to enable.")] = None,
    max_turns: Annotated[int | None, typer.Option(help="Planner turns at most.")] = None,
    max_seconds: Annotated[float | None, typer.Option(help="Wall-clock budget of the question.")] = None,
    tool_timeout: Annotated[float | None, typer.Option(help="Wall-clock budget of one tool call.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature of every role.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log engine and tool details.")] = False,
) -> None:
    """Answer a question with the planner → executor → verifier loop and the generator."""
    from agentflow.flow import Flow

    _setup_logging(verbose)
    if not question.strip():
        raise _fail("the question is empty")
    try:
        flow_config = apply_overrides(load_config(config, bundled=not (model or base_url)), model=model,
                                      base_url=base_url, model_name=model_name, tools=tools, max_turns=max_turns,
                                      max_seconds=max_seconds, tool_timeout=tool_timeout, temperature=temperature)
        flow = Flow.from_config(flow_config)
        console.print(f"[bold]Question:[/] {escape(question.strip())}", highlight=False)
        trajectory = flow.solve(question, on_event=StepPrinter(show_answer=False))
    except AgentFlowError as err:
        raise _fail(str(err)) from None
    trajectory_out = trajectory_out or _new_trajectory_path()
    trajectory.write(trajectory_out)
    for failure in trajectory.failures:
        style = "red" if failure.infrastructure else "yellow"
        console.print(f"[{style}]{escape(failure.stage)} {escape(failure.kind)}[/]: "
                      f"{escape(truncate(failure.message, 300))}", highlight=False)
    # the answer after the notes on what went wrong, so that it is the last thing read before the totals
    console.print(f"\n[bold green]Answer:[/] {escape(trajectory.answer)}", highlight=False)
    usage = trajectory.usage
    console.print(f"[dim]{len(trajectory.turns)} turn(s), stop: {trajectory.stop_reason}, {usage.calls} model calls, "
                  f"{usage.prompt_tokens}+{usage.completion_tokens} tokens, {trajectory.seconds:.1f}s[/]")
    console.print(f"trajectory written to {trajectory_out}; every step, prompt and reply: "
                  f"agentflow view {shlex.quote(str(trajectory_out))}", markup=False, highlight=False, soft_wrap=True)
    if trajectory.infrastructure_failure is not None:
        raise typer.Exit(1)


def _new_trajectory_path() -> Path:
    """A fresh file for `solve`'s record: CACHE/trajectories/solve-<UTC time>-<pid>.json."""
    import datetime
    import os

    from agentflow.bundled import cache_dir

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return cache_dir() / "trajectories" / f"solve-{stamp}-{os.getpid()}.json"


@tool_app.command("list")
def tool_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print the full cards as JSON.")] = False,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML flow config: also list the tools "
                                                "of its MCP servers (they are started to be asked).")] = None,
) -> None:
    """Show the tool cards: the built-in tools, and those of the config's MCP servers."""
    from agentflow.tools.base import create_tool, tool_class_name, tool_classes

    classes = tool_classes()
    cards = [cls().card() for cls in classes.values()]
    try:
        flow_config = load_config(config)
        unknown = [name for name, settings in flow_config.tools.items()
                   if tool_class_name(name, settings) not in classes]
        if unknown:
            raise ConfigError(f"{config}: unknown tool(s) {', '.join(unknown)}; available: {', '.join(classes)}")
        # tools the config offers under names of its own (`tool: CLASS`), with the description it gives them
        cards += [create_tool(name, settings).card() for name, settings in flow_config.tools.items()
                  if name not in classes]
        if flow_config.mcp_servers:
            from agentflow.tools.mcp.tool import mcp_cards

            cards += mcp_cards(flow_config.mcp_servers)
    except AgentFlowError as err:
        raise _fail(str(err)) from None
    if as_json:
        console.print_json(json.dumps(cards))
        return
    table = Table(title="Tools", show_lines=True)
    # names and servers are what the user types: never cut them, let the prose columns wrap instead
    longest = max((len(card["name"]) for card in cards), default=4)
    table.add_column("name", no_wrap=True, min_width=longest)
    table.add_column("server", no_wrap=True)
    for column in ("description", "input", "limitations"):
        table.add_column(column, ratio=1, overflow="fold")
    for card in cards:
        props = card["input_schema"].get("properties", {})
        fields = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
        table.add_row(*(escape(text) for text in (card["name"], card.get("server", "(built-in)"), card["description"],
                                                  fields, card["limitations"])))
    console.print(table)


@tool_app.command("run")
def tool_run(
    name: Annotated[str, typer.Argument(help="Tool name (see `agentflow tool list`); SERVER.TOOL for a tool of "
                                        "an MCP server in --config.")],
    input_json: Annotated[str, typer.Option("--input", "-i", help="Tool input as JSON.")],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML flow config (tool settings, "
                                                "engine of LLM-backed tools).")] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds before the call is cut off.")] = None,
) -> None:
    """Run one tool directly and print its JSON result."""
    _setup_logging(False)
    try:
        arguments = json.loads(input_json)
    except json.JSONDecodeError as err:
        raise _fail(f"--input is not valid JSON: {err}") from None
    if not isinstance(arguments, dict):
        raise _fail("--input must be a JSON object")
    try:
        flow_config = load_config(config)
        result = asyncio.run(_run_tool(flow_config, name, arguments, timeout or flow_config.limits.tool_timeout_s))
    except (ToolError, AgentFlowError) as err:
        _print_json({"tool": name, "error": {"kind": err.kind, "message": str(err)}})
        raise typer.Exit(1) from None
    _print_json({"tool": name, **result})


def _print_json(value: dict[str, Any]) -> None:
    """Valid JSON, with control characters and bidi controls in its strings written as inert `\\uXXXX` escapes."""
    text = json_terminal_safe(json.dumps(value, ensure_ascii=False, indent=2))
    console.print(text, markup=False, highlight=False, soft_wrap=True)


async def _run_tool(config: FlowConfig, name: str, arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
    from agentflow.engines import build_engine
    from agentflow.errors import ToolTimeoutError
    from agentflow.tools.base import Tool, ToolContext, create_tool

    if name.partition(".")[0] in config.mcp_servers:  # SERVER.TOOL: starts that server only
        from agentflow.tools.mcp.tool import mcp_tool_named

        tool: Tool = mcp_tool_named(config.mcp_servers, name)
    else:
        tool = create_tool(name, config.tools.get(name, {}))
    engine = None
    try:
        await tool.check()
        args = tool.parse_input(arguments)
        ctx = ToolContext(timeout_s=timeout)
        if tool.uses_llm:
            role = config.roles.tools
            engine = build_engine(config.engines[role.engine])

            async def llm(messages: list[dict[str, str]]) -> Any:
                return await engine.generate(messages, role.sampling)

            ctx = ToolContext(llm=llm, timeout_s=timeout)
        try:
            result = await asyncio.wait_for(tool.run(args, ctx), timeout=timeout)
        except asyncio.TimeoutError:
            raise ToolTimeoutError(f"tool {name!r} exceeded {timeout:.1f}s") from None
        shown: dict[str, Any] = {"output": result.output, "data": result.data, "truncated": result.truncated}
        if result.llm_calls:
            # per-token ids and log-probs are hundreds of lines a reader never needs (trajectories keep them)
            shown["llm_calls"] = _without_token_arrays(result.llm_calls)
        return shown
    finally:
        await tool.aclose()
        if engine is not None:
            await engine.aclose()


def _without_token_arrays(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_token_arrays(v) for k, v in value.items()
                if k not in ("prompt_token_ids", "token_ids", "logprobs")}
    if isinstance(value, list):
        return [_without_token_arrays(v) for v in value]
    return value


_mount_subcommands()


def main() -> None:
    app()

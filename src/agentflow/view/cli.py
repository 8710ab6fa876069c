"""`agentflow view PATH [PATH ...]`: serve the viewer on this machine, or `--export` it to one HTML file."""

from __future__ import annotations

import logging
import os
import sys
import threading
import webbrowser
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from agentflow.errors import AgentFlowError

log = logging.getLogger(__name__)

console = Console()
err_console = Console(stderr=True)


def browser_available() -> bool:
    """A graphical browser can be opened: not on a headless server, where `webbrowser` would start lynx in
    this terminal."""
    if sys.platform in ("darwin", "win32") or os.environ.get("BROWSER"):
        return True
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return False
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return True


def view(
    paths: Annotated[list[Path], typer.Argument(
        help="A trajectory .json, an eval run directory (agentflow eval --out), a training run directory "
             "(agentflow train --out), or two eval run directories to compare them.", show_default=False)],
    export: Annotated[Path | None, typer.Option(
        "--export", help="Write one self-contained HTML file (no server needed to open it) and exit.")] = None,
    host: Annotated[str, typer.Option(
        help="Address to listen on. The default serves this machine only; 0.0.0.0 shows your runs to the "
             "network.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: a free one).", min=0, max=65535)] = 0,
    open_browser: Annotated[bool, typer.Option("--open/--no-open", help="Open the page in a browser, when one is "
                                               "available.")] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every request.")] = False,
) -> None:
    """See trajectories, eval runs (live while they run), comparisons and training runs in the browser."""
    from agentflow.view.api import ViewApp

    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = ViewApp(paths)
    except AgentFlowError as err:
        err_console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False)
        raise typer.Exit(2) from None
    problems = app.problems()
    if len(problems) == len(app.sources):
        for path, problem in problems.items():
            err_console.print(f"[bold red]error:[/] {escape(str(path))}: {escape(problem)}", highlight=False)
        err_console.print("[bold red]error:[/] nothing readable to view", highlight=False)
        raise typer.Exit(2)
    for path, problem in problems.items():
        err_console.print(f"[yellow]warning:[/] {escape(str(path))}: {escape(problem)}; its page will say so",
                          highlight=False)
    if export is not None:
        from agentflow.view.export import write_export

        stats = write_export(app, export)
        console.print(f"wrote {escape(str(stats.path))}: {stats.routes} pages, {stats.file_bytes / 1e6:.1f} MB "
                      f"({stats.json_bytes / 1e6:.1f} MB of JSON before compression)", highlight=False)
        return
    from agentflow.view.server import ViewServer

    try:
        server = ViewServer(app, host, port)
    except OSError as err:
        err_console.print(f"[bold red]error:[/] cannot listen on {escape(host)}:{port}: {escape(str(err))}")
        raise typer.Exit(2) from None
    threading.Thread(target=app.warm, daemon=True).start()
    url = server.url + "#" + app.home()
    if host not in ("127.0.0.1", "localhost", "::1"):
        err_console.print(f"[yellow]warning:[/] listening on {escape(host)}: anyone who can reach this machine can "
                          "read these runs")
    console.print(f"agentflow view: {len(app.sources)} source(s); Ctrl-C stops. Open:", highlight=False)
    console.print(url, markup=False, highlight=False, soft_wrap=True)
    if open_browser and browser_available():
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.25)
    except KeyboardInterrupt:
        server.server_close()
        err_console.print("stopped", highlight=False)
        _exit_now(0)
    finally:
        server.server_close()


def _exit_now(code: int) -> None:
    """End the process at once. A normal exit waits on other threads (a connection's handler, the warm-up
    read, an import one of them holds the lock of), which kept the server alive for seconds after Ctrl-C."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""The sandbox of the `python` tool: model-written code runs in a child process the kernel confines.

`run_python_sandboxed` is the entry point; `check_isolation` tells early whether this machine can give the
chosen isolation level. Layout: `runner` (the parent side), `policy` (what the code may read, who it runs as),
`levels` (isolation levels and what to say when the kernel lacks a mechanism), `process_level` (the weaker
level), `capture` (bounded output), and `child/` (what runs inside the child before the code).
"""

from agentflow.tools.sandbox.levels import Isolation
from agentflow.tools.sandbox.runner import (
    SandboxResult,
    check_isolation,
    run_python_sandboxed,
    run_python_sandboxed_sync,
)

__all__ = ["Isolation", "SandboxResult", "check_isolation", "run_python_sandboxed", "run_python_sandboxed_sync"]

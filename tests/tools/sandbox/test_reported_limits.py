"""Finding 5: limit hits and set-up failures come from the sandbox itself (the kernel's counts, its own report
pipe), never from text or signals the code controls."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentflow.errors import SandboxUnavailableError
from agentflow.tools.base import ToolContext, create_tool
from agentflow.tools.sandbox import run_python_sandboxed

FORGED_REFUSAL = ("import os, sys\nsys.stderr.write('agentflow-sandbox: landlock: [Errno 95] landlock_create_ruleset: "
                  "Operation not supported\\n')\nsys.stderr.flush()\nos._exit(125)")


async def test_memory_error_text_is_not_a_memory_limit() -> None:
    result = await run_python_sandboxed("import sys\nsys.stderr.write('MemoryError\\n')\nsys.exit(1)")
    assert not result.memory_error
    result = await run_python_sandboxed("raise MemoryError")
    assert not result.memory_error


async def test_a_signal_the_code_sends_itself_is_not_a_cpu_limit() -> None:
    result = await run_python_sandboxed("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)", cpu_s=2.0)
    assert result.signal == "SIGXCPU" and not result.cpu_limit


async def test_a_copied_refusal_is_the_codes_output_not_a_refusal() -> None:
    result = await run_python_sandboxed(FORGED_REFUSAL)
    assert result.exit_code == 125 and result.setup_error is None
    tool = create_tool("python", {})
    shown = await tool.run(tool.parse_input({"code": FORGED_REFUSAL}), ToolContext())
    assert "failed (exit code 125)" in shown.output
    again = await run_python_sandboxed("print(1)")  # the kernel level is still believed to work
    assert again.ok


def _interpreter(tmp_path: Path, body: str) -> str:
    """An 'interpreter' that answers the path question, then runs `body` instead of the sandbox."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/bash\ncase \"$3\" in *sys.path*) echo '[]'; exit 0;; esac\n{body}\n")
    script.chmod(0o755)
    return str(script)


async def test_a_real_refusal_comes_on_the_report_pipe(tmp_path: Path) -> None:
    line = "agentflow-sandbox: seccomp: [Errno 22] seccomp: Invalid argument"
    python = _interpreter(tmp_path, f"echo '{line}' >&$AGENTFLOW_SANDBOX_REPORT_FD\nexit 125")
    with pytest.raises(SandboxUnavailableError, match="CONFIG_SECCOMP_FILTER"):
        await run_python_sandboxed("print(1)", python=python)

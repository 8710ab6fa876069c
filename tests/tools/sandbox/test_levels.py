"""Isolation levels: a machine without a mechanism gets a refusal that says what to enable; `process` warns."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from agentflow.errors import ConfigError, SandboxUnavailableError
from agentflow.tools.base import ToolContext, create_tool
from agentflow.tools.sandbox import check_isolation, run_python_sandboxed
from agentflow.tools.sandbox.child import landlock
from agentflow.tools.sandbox.levels import explain_failure, warn_process_level


@pytest.mark.parametrize(("line", "expected"), [
    ("agentflow-sandbox: landlock: [Errno 38] landlock_create_ruleset: Function not implemented",
     ["not built into this kernel", "CONFIG_SECURITY_LANDLOCK"]),
    ("agentflow-sandbox: landlock: [Errno 95] landlock_create_ruleset: Operation not supported",
     ["not enabled at boot", "lsm="]),
    ("agentflow-sandbox: namespaces (unshare): [Errno 1] unshare: Operation not permitted",
     ["unprivileged user namespaces", "user.max_user_namespaces"]),
    ("agentflow-sandbox: seccomp: [Errno 22] seccomp: Invalid argument", ["CONFIG_SECCOMP_FILTER"]),
    ("agentflow-sandbox: OOM score: [Errno 13] Permission denied", ["oom_score_adj"]),
    ("agentflow-sandbox: cgroup: [Errno 13] Permission denied: 'x/cgroup.procs'", ["removed meanwhile"]),
    ("agentflow-sandbox: host name (UTS namespace): [Errno 1] sethostname", ["allow it as for namespaces"]),
])
def test_explain_failure_names_the_mechanism_and_the_fix(line: str, expected: list[str]) -> None:
    text = explain_failure("some noise\n" + line + "\n")
    for part in expected:
        assert part in text


def _fake_interpreter(tmp_path: Path, setup_line: str) -> str:
    """An 'interpreter' that answers the path question and then fails set-up like a kernel without Landlock."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\ncase \"$3\" in *sys.path*) echo '[]'; exit 0;; esac\n"
                      f"echo '{setup_line}' >&2\nexit 125\n")
    script.chmod(0o755)
    return str(script)


async def test_a_missing_mechanism_refuses_with_the_fix(tmp_path: Path) -> None:
    python = _fake_interpreter(tmp_path, "agentflow-sandbox: landlock: [Errno 95] no: Operation not supported")
    with pytest.raises(SandboxUnavailableError, match="Landlock is built in but not enabled") as caught:
        await run_python_sandboxed("print(1)", python=python)
    assert "isolation: process" in str(caught.value) and isinstance(caught.value, ConfigError)
    with pytest.raises(SandboxUnavailableError):  # the answer is kept: no second probe needed to refuse again
        await check_isolation(python)


async def test_the_python_tool_refuses_at_check_and_at_run(tmp_path: Path) -> None:
    python = _fake_interpreter(tmp_path, "agentflow-sandbox: namespaces (unshare): [Errno 1] x: not permitted")
    tool = create_tool("python", {"python": python})
    with pytest.raises(SandboxUnavailableError, match="user namespaces"):
        await tool.check()
    with pytest.raises(SandboxUnavailableError):
        await tool.run(tool.parse_input({"code": "print(1)"}), ToolContext())


async def test_the_process_level_warns_once_and_is_recorded(caplog: pytest.LogCaptureFixture) -> None:
    warn_process_level.cache_clear()
    with caplog.at_level(logging.WARNING, logger="agentflow.tools.sandbox.levels"):
        first = await run_python_sandboxed("print(1)", isolation="process")
        second = await run_python_sandboxed("print(2)", isolation="process")
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "process" in caplog.records[0].message
    assert first.isolation[0] == second.isolation[0] == "level:process"
    assert not any(layer.startswith("landlock") for layer in first.isolation)


async def test_the_kernel_level_records_its_layers() -> None:
    result = await run_python_sandboxed("print(1)", python=sys.executable)
    assert result.ok, result.stderr
    assert result.isolation[0] == "level:kernel"
    for layer in ("user_namespace", "pid_namespace", "mount_namespace", "network_namespace", "seccomp"):
        assert layer in result.isolation
    assert f"landlock:abi{landlock.abi_version()}" in result.isolation


@pytest.mark.parametrize(("abi", "extra"), [(1, 0), (2, landlock.REFER), (3, landlock.REFER | landlock.TRUNCATE),
                                            (5, landlock.REFER | landlock.TRUNCATE | landlock.IOCTL_DEV)])
def test_landlock_handles_every_right_of_the_abi(abi: int, extra: int) -> None:
    assert landlock.handled_fs(abi) == ((1 << 13) - 1) | extra

"""Helpers of the hostile-code tests: switching off the audit hook from inside, and looking for leftovers."""

from __future__ import annotations

import contextlib
import os
import textwrap
from pathlib import Path

import pytest

from agentflow.tools.sandbox import SandboxResult, cgroup, run_python_sandboxed

# Plain Python, no C: the hook calls a closure `deny`, which any code can find through the garbage collector and
# give a body that does nothing; `subprocess` gets a fresh copy of the C helper the bootstrap replaced. The last
# lines prove it: ctypes look-ups are the hook's to refuse.
HOOK_OFF = """\
import gc, sys
for _obj in gc.get_objects():
    _code = getattr(_obj, "__code__", None)
    if _code is not None and _code.co_name == "deny" and _code.co_varnames == ("what",):
        _obj.__code__ = (lambda what: None).__code__
del sys.modules["_posixsubprocess"]
import _posixsubprocess, subprocess
subprocess._posixsubprocess = _posixsubprocess
import ctypes
ctypes.CDLL(None).getpid()
print("hook off", flush=True)
"""


async def run_hostile(body: str, **kwargs: object) -> SandboxResult:
    """Run `body` after switching the hook off; fails the test if the hook could not be switched off."""
    result = await run_python_sandboxed(HOOK_OFF + textwrap.dedent(body), **kwargs)  # type: ignore[arg-type]
    assert result.stdout.startswith("hook off\n"), result.stdout + result.stderr
    return result


def attempt(action: str) -> str:
    """Code that runs `action` and prints `escaped`, or `blocked <error>` when it raises."""
    return (f"try:\n{textwrap.indent(textwrap.dedent(action), '    ')}\n    print('escaped', flush=True)\n"
            "except Exception as err:\n    print('blocked', type(err).__name__, err, flush=True)\n")


def pid_namespace_of(pid: int, *, children: bool = False) -> str | None:
    """The `pid:[inode]` name of `pid`'s PID namespace (or the one its children get); None if it is gone."""
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/{pid}/ns/{'pid_for_children' if children else 'pid'}")
    return None


def processes_in(namespace: str) -> list[int]:
    """Pids (as we see them) of the processes still in the PID namespace `namespace`."""
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and pid_namespace_of(int(entry.name)) == namespace]


def session_members(session: int) -> list[int]:
    """Pids of the processes in session `session` (field 6 of /proc/<pid>/stat)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) == session:
                    members.append(int(entry.name))
    return members


def run_cgroups_available() -> bool:
    """Whether this machine lets the sandbox make a cgroup per run (then memory and CPU are bounded per run)."""
    group = cgroup.create(64 * 1024 * 1024, 8)
    if group is None:
        return False
    group.remove()
    return True


CGROUPS = run_cgroups_available()
needs_cgroups = pytest.mark.skipif(not CGROUPS, reason="this machine gives no cgroup per run (docs/tools.md)")

"""The `process` isolation level: what the parent can add without kernel sandboxing (the earlier design).

A network namespace through `unshare` where allowed, and a drop to `nobody` when we run as root and the
interpreter is readable by it. Everything else at this level is the audit hook and the resource limits.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from agentflow.tools.sandbox.policy import NOBODY, unprivileged_identity

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def netns_prefix(as_root: bool) -> tuple[str, ...]:
    """The `unshare` prefix that gives the child its own empty network namespace, if this kernel allows it."""
    tool = shutil.which("unshare")
    if tool is None:
        return ()
    prefix = (tool, "--net") if as_root else (tool, "--user", "--net")
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=5, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError):
        return ()
    if probe.returncode != 0:
        log.info("no network namespace for the sandbox (%s); relying on the audit hook",
                 probe.stderr.decode(errors="replace").strip())
        return ()
    return prefix


def world_accessible(path: str) -> bool:
    """True when everyone may read (and traverse) `path` and each directory above it."""
    current = Path(path)
    for part in [current, *current.parents]:
        try:
            mode = part.stat().st_mode
        except OSError:
            return False
        needed = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) or part == current else 0)
        if mode & needed != needed:
            return False
    return True


@functools.lru_cache(maxsize=4)
def drop_target(python: str) -> tuple[int, int] | None:
    """(uid, gid) of `nobody` when we are root and `python`'s files are readable by it; else None."""
    if os.geteuid() != 0:
        return None
    real = os.path.realpath(python)
    roots = {real, os.path.dirname(os.path.dirname(real))}
    if os.path.realpath(sys.executable) == real:
        roots |= {p for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.__file__)) if p}
        roots |= {p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p}
    if not all(world_accessible(p) for p in roots):
        log.info("sandbox runs as root: the interpreter at %s is not readable by %s", real, NOBODY)
        return None
    return unprivileged_identity()

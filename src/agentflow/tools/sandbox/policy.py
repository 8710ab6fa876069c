"""What the sandboxed code may read and who it runs as, worked out in the parent before each run."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

NOBODY = "nobody"
# Shared libraries, the dynamic loader's cache, time zones and user names: what a program needs to start and
# what ordinary code reads. No home directory, no /tmp, no /run (sockets of the host's services), no /sys.
SYSTEM_READ_PATHS = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/ld.so.conf",
    "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
)
_PATHS_OF_PYTHON = "import json, sys; print(json.dumps(sys.path))"


@dataclass(frozen=True)
class ReadPolicy:
    """Real paths bound read-only into the sandbox (none inside another), and top-level links to recreate."""

    paths: tuple[str, ...]
    links: dict[str, str]


@functools.lru_cache(maxsize=8)
def interpreter_paths(python: str) -> tuple[str, ...]:
    """Where `python -I` imports from (standard library, site-packages, .pth entries); asked once per interpreter.

    Only these, not the interpreter's prefix: a venv or pyenv under the home directory exposes its library
    folders and nothing else of the home.
    """
    done = subprocess.run([python, "-I", "-c", _PATHS_OF_PYTHON], capture_output=True, timeout=60, check=True,
                          env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
    return tuple(path for path in json.loads(done.stdout) if path)


def read_policy(python: str, extra: Sequence[str] = ()) -> ReadPolicy:
    """The default read set (system libraries, the interpreter's own folders) plus `extra`, resolved."""
    links: dict[str, str] = {}
    wanted: list[str] = []
    for path in SYSTEM_READ_PATHS:
        if os.path.islink(path) and os.path.dirname(path) == "/":
            links[path] = os.readlink(path)
        wanted.append(path)
    for path in extra:
        if not os.path.exists(path):
            log.warning("sandbox read path %s does not exist; skipped", path)
    wanted += [*interpreter_paths(python), *extra]
    real = sorted({os.path.realpath(path) for path in wanted if os.path.exists(path)})
    kept = tuple(p for p in real if not any(p.startswith(q.rstrip("/") + "/") for q in real if q != p))
    return ReadPolicy(kept, {path: target for path, target in links.items() if path not in kept})


@functools.lru_cache(maxsize=1)
def unprivileged_identity() -> tuple[int, int]:
    """(uid, gid) of `nobody`, whom root runs the code as."""
    import pwd  # POSIX only, like the rest of the sandbox; imported here so the module itself imports anywhere

    try:
        entry = pwd.getpwnam(NOBODY)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def tasks_of(uid: int) -> int:
    """Threads currently running under `uid`: RLIMIT_NPROC counts them all, so the limit is set above them."""
    count = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += max(1, len(os.listdir(f"/proc/{entry.name}/task")))
    return count

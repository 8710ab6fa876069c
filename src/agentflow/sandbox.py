"""Run untrusted Python code in a limited subprocess; never in our own process.

Layers, each cheap and each covering a gap of the others:

* a new session (process group) that is killed as a whole on the wall-clock limit or on cancellation;
* `resource` limits set by the child's bootstrap before any user code runs (CPU, address space, file size,
  open files, processes, no core dumps);
* `python -I -B`: isolated mode (no PYTHON* variables, no user site, no script directory on sys.path);
* a scrubbed environment: a minimal PATH/LANG, nothing inherited from our process;
* a fresh temporary directory as the working directory, removed afterwards;
* an audit hook (`sys.addaudithook`, which cannot be removed from Python) that rejects sockets, process
  creation (fork, exec, spawn, subprocess, system), signals to other processes, ctypes symbol look-ups, writes
  outside the working directory and reads of other processes' /proc entries;
* where the kernel allows it, a new network namespace (`unshare --net`: no interface but a down loopback);
* when we run as root and the interpreter is readable by everyone, the bootstrap drops to `nobody`, which makes
  RLIMIT_NPROC effective (root ignores it) and the file system's own permissions apply.

The audit hook is what stops a fork bomb when we run as root without the privilege drop: CPython raises an
audit event before every fork/exec/spawn. It is not a boundary against an attacker who can corrupt the
interpreter's memory; run agentflow in a container for that threat.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

_READ_CHUNK = 64 * 1024
_NOBODY = "nobody"

# The child's first code. It runs before any user code (compiled as "<sandbox>" by `_LAUNCHER`), reads the
# user's code from stdin, applies the limits, drops privileges when asked, installs the audit hook, then runs
# the code as `__main__` and prints a traceback without its own frame.
BOOTSTRAP = r'''
import json, os, resource, sys
cfg = json.loads(sys.argv[2])
sys.argv = ["<code>"]
source = sys.stdin.buffer.read().decode("utf-8", "replace")
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
for _name, (_soft, _hard) in cfg["rlimits"].items():
    _res = getattr(resource, _name)
    _limit = resource.getrlimit(_res)[1]
    if _limit != resource.RLIM_INFINITY:
        _soft, _hard = min(_soft, _limit), min(_hard, _limit)
    try:
        resource.setrlimit(_res, (_soft, _hard))
    except (ValueError, OSError) as _err:
        sys.stderr.write(f"sandbox: could not set {_name}: {_err}\n")
if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["gid"])
    os.setuid(cfg["uid"])

import linecache, traceback, types
import _posixsubprocess

def _install_hook(root, pid):
    """Build the audit hook over closure state (not module globals), then install it for good."""
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    allowed_writes = ("/dev/null",)
    blocked = frozenset({
        "os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp", "os.spawn", "os.exec", "os.system",
        "os.startfile", "subprocess.Popen", "pty.spawn", "os.chroot", "os.mknod", "os.mkfifo",
        "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata",
        "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.getnameinfo",
        "socket.sethostname", "urllib.Request", "http.client.connect", "ftplib.connect", "smtplib.connect",
        "poplib.connect", "imaplib.open", "nntplib.connect", "telnetlib.Telnet.open", "webbrowser.open",
    })
    path_events = {  # event -> indices of path arguments that must stay inside root
        "os.rename": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.symlink": (1,),
        "os.link": (0, 1), "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
        "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,), "os.chflags": (0,),
    }
    realpath, fsdecode, sep, modules = os.path.realpath, os.fsdecode, os.sep, sys.modules

    def deny(what):
        raise PermissionError(f"sandbox: {what} is not allowed")

    def inside(path):
        if isinstance(path, int):
            return True
        full = realpath(fsdecode(path))
        return full == root or full.startswith(root + sep) or full in allowed_writes

    def other_proc(path):
        if isinstance(path, int):
            return False
        parts = realpath(fsdecode(path)).split(sep)
        return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != pid

    def hook(event, args):
        if event in blocked or event.startswith(("os.exec", "os.spawn", "os.posix_spawn")):
            deny(event)
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            if path is None:
                return
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags > 0 and flags & write_flags)
            if writing and not inside(path):
                deny(f"writing {fsdecode(path)!r} (outside the working directory)")
            if other_proc(path):
                deny(f"reading {fsdecode(path)!r}")
        elif event in path_events:
            for index in path_events[event]:
                if index < len(args) and args[index] is not None and not inside(args[index]):
                    deny(f"{event} on {fsdecode(args[index])!r} (outside the working directory)")
        elif event == "socket.__new__":
            if len(args) > 1 and args[1] not in (-1, 1):  # AF_UNIX (1) socketpairs back asyncio's self-pipe
                deny("opening a network socket")
        elif event in ("os.kill", "os.killpg"):
            if event == "os.killpg" or args[0] not in (0, int(pid)):
                deny(f"{event} (signalling another process)")
        elif event == "import" and args[0] == "_posixsubprocess" and args[0] not in modules:
            deny("importing _posixsubprocess again")

    def denied_fork_exec(*args, **kwargs):
        deny("subprocess creation")

    # subprocess calls this C function after its own audit event; a direct call raises no event of its own.
    _posixsubprocess.fork_exec = denied_fork_exec
    sys.addaudithook(hook)


sys.dont_write_bytecode = True
_install_hook(os.path.realpath(cfg["dir"]), str(os.getpid()))
del _install_hook, cfg

linecache.cache["<code>"] = (len(source), None, source.splitlines(True), "<code>")
main = types.ModuleType("__main__")
main.__dict__["__builtins__"] = __builtins__
sys.modules["__main__"] = main
try:
    compiled = compile(source, "<code>", "exec")
except (SyntaxError, ValueError) as err:
    sys.stderr.write("".join(traceback.format_exception_only(type(err), err)))
    sys.exit(1)
try:
    exec(compiled, main.__dict__)
except SystemExit:
    raise
except BaseException as err:
    report = traceback.TracebackException(type(err), err, err.__traceback__.tb_next)
    for each in (report, *(e for e in (report.__cause__, report.__context__) if e is not None)):
        each.stack = traceback.StackSummary.from_list([f for f in each.stack if f.filename != "<sandbox>"])
    sys.stderr.write("".join(report.format()))
    sys.exit(1)
'''
# `-c` runs this; the bootstrap arrives as argv[1] so that its frames carry a name tracebacks can hide.
_LAUNCHER = "import sys; exec(compile(sys.argv[1], '<sandbox>', 'exec'))"


class SandboxResult(BaseModel):
    """What one sandboxed run did. `exit_code` follows subprocess: negative means killed by that signal."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    signal: str | None = Field(None, description="Name of the signal that ended the process, if any.")
    timed_out: bool = Field(False, description="Killed by the wall-clock limit.")
    memory_error: bool = Field(False, description="The code ran out of its address-space limit.")
    cpu_limit: bool = Field(False, description="Killed by the CPU-time limit (SIGXCPU).")
    stdout_dropped_bytes: int = 0
    stderr_dropped_bytes: int = 0
    seconds: float = 0.0
    isolation: list[str] = Field(default_factory=list, description="Layers that were active for this run.")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        return bool(self.stdout_dropped_bytes or self.stderr_dropped_bytes)


class _Capture:
    """Keeps the head and the tail of a stream within a byte budget; counts what it drops in between."""

    def __init__(self, limit_bytes: int) -> None:
        self.head_cap = max(0, limit_bytes // 2)
        self.tail_cap = max(0, limit_bytes - self.head_cap)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_cap:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_cap:  # trim rarely, so feeding stays linear
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - min(len(self.tail), self.tail_cap)

    def text(self) -> str:
        tail = bytes(self.tail[-self.tail_cap:]) if self.tail_cap else b""
        head = self.head.decode("utf-8", "replace")
        if not self.dropped:
            return head + tail.decode("utf-8", "replace")
        return (f"{head}\n... [truncated {self.dropped} bytes] ...\n"
                f"{tail.decode('utf-8', 'replace')}")


async def _drain(stream: asyncio.StreamReader | None, capture: _Capture) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_READ_CHUNK):
        capture.feed(chunk)


@functools.lru_cache(maxsize=4)
def _netns_prefix(as_root: bool) -> tuple[str, ...]:
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


def _world_accessible(path: str) -> bool:
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
def _drop_target(python: str) -> tuple[int, int] | None:
    """(uid, gid) of `nobody` when we are root and `python`'s files are readable by it; else None."""
    if os.geteuid() != 0:
        return None
    real = os.path.realpath(python)
    roots = {real, os.path.dirname(os.path.dirname(real))}
    if os.path.realpath(sys.executable) == real:
        roots |= {p for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.__file__)) if p}
        roots |= {p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p}
    if not all(_world_accessible(p) for p in roots):
        log.info("sandbox runs as root: the interpreter at %s is not readable by %s", real, _NOBODY)
        return None
    import pwd  # POSIX only, like the rest of the sandbox; imported here so the module itself imports anywhere

    try:
        entry = pwd.getpwnam(_NOBODY)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def _tasks_of(uid: int) -> int:
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


async def _feed_and_wait(proc: asyncio.subprocess.Process, code: str) -> int:
    """Hand the code to the bootstrap on stdin, then wait for the exit; both count against the wall clock."""
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the child may already be gone
        proc.stdin.write(code.encode("utf-8", "replace"))
        await proc.stdin.drain()
        proc.stdin.close()
    return await proc.wait()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


async def run_python_sandboxed(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_output_chars: int = 10_000,
    cpu_s: float | None = None,
    max_file_mb: int = 16,
    max_open_files: int = 64,
    max_processes: int = 16,
    python: str | None = None,
    network_namespace: bool = True,
    drop_privileges: bool | None = None,
    on_start: Callable[[int], None] | None = None,
) -> SandboxResult:
    """Run `code` once in a sandboxed `python -I` subprocess and report what happened.

    Never raises for anything the code does: a timeout, a crash or a limit is a field of the result.
    Cancelling the awaiting task kills the whole process group and removes the working directory.
    `max_output_chars` bounds each of stdout and stderr (counted in bytes); the head and tail are kept.
    `drop_privileges=None` drops to `nobody` when running as root and the interpreter allows it.
    `on_start` receives the child's pid (which is also its process-group id).
    """
    python = python or sys.executable
    # Without its own CPU limit, the wall clock (which CPU time cannot outrun) decides; the +1 keeps it so.
    cpu_seconds = max(1, math.ceil(cpu_s) if cpu_s is not None else math.ceil(timeout_s) + 1)
    drop = await asyncio.to_thread(_drop_target, python) if drop_privileges is not False else None
    if drop_privileges and drop is None:
        log.warning("sandbox: cannot drop privileges (not root, or %s is not world-readable)", python)
    prefix = await asyncio.to_thread(_netns_prefix, os.geteuid() == 0) if network_namespace else ()
    run_uid = drop[0] if drop else os.getuid()
    # Root ignores RLIMIT_NPROC, so only other users need the scan of their running tasks.
    nproc = max_processes + (await asyncio.to_thread(_tasks_of, run_uid) if run_uid != 0 else 0)
    workdir = tempfile.mkdtemp(prefix="agentflow-sandbox-")
    isolation = ["audit_hook", "rlimits", "scrubbed_env", "tempdir"]
    if prefix:
        isolation.append("network_namespace")
    if drop:
        os.chown(workdir, drop[0], drop[1])
        isolation.append(f"uid:{drop[0]}")
    config = {
        "dir": workdir,
        "uid": drop[0] if drop else None,
        "gid": drop[1] if drop else None,
        "rlimits": {
            # (soft, hard); the CPU soft limit sends SIGXCPU, the hard one a second later SIGKILL.
            "RLIMIT_CPU": (cpu_seconds, cpu_seconds + 1),
            "RLIMIT_AS": (memory_mb * 1024 * 1024,) * 2,
            "RLIMIT_FSIZE": (max_file_mb * 1024 * 1024,) * 2,
            "RLIMIT_NOFILE": (max_open_files,) * 2,
            "RLIMIT_NPROC": (nproc,) * 2,
            "RLIMIT_CORE": (0, 0),
        },
    }
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        # Thread pools of numeric libraries count against RLIMIT_NPROC and the address-space limit.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }
    argv = [*prefix, python, "-I", "-B", "-c", _LAUNCHER, BOOTSTRAP, json.dumps(config)]
    out, err = _Capture(max_output_chars), _Capture(max_output_chars)
    timed_out = False
    start = time.perf_counter()
    proc: asyncio.subprocess.Process | None = None
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=workdir, env=env, start_new_session=True, close_fds=True)
        if on_start is not None:
            on_start(proc.pid)
        readers = [asyncio.create_task(_drain(proc.stdout, out)), asyncio.create_task(_drain(proc.stderr, err))]
        try:
            try:
                await asyncio.wait_for(_feed_and_wait(proc, code), timeout=timeout_s)
            except asyncio.TimeoutError:
                timed_out = True
                _kill_group(proc.pid)
                await proc.wait()
            _kill_group(proc.pid)  # anything the code left behind in its group
            # The pipes close when the group is gone; the bound only guards against an escaped holder.
            await asyncio.wait_for(asyncio.gather(*readers), timeout=5.0)
        finally:
            for task in readers:
                task.cancel()
    except asyncio.TimeoutError:
        log.warning("sandbox output pipes stayed open after the process group was killed")
    finally:
        if proc is not None and proc.returncode is None:
            _kill_group(proc.pid)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=5.0)
        shutil.rmtree(workdir, ignore_errors=True)
    seconds = time.perf_counter() - start
    assert proc is not None
    exit_code = proc.returncode
    stderr = err.text()
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    return SandboxResult(
        stdout=out.text(),
        stderr=stderr,
        exit_code=exit_code,
        signal=_signal_name(exit_code),
        timed_out=timed_out,
        memory_error=tail.startswith("MemoryError") or "\nMemoryError" in stderr[-2000:],
        cpu_limit=exit_code == -signal.SIGXCPU,
        stdout_dropped_bytes=out.dropped,
        stderr_dropped_bytes=err.dropped,
        seconds=seconds,
        isolation=isolation,
    )


def run_python_sandboxed_sync(code: str, **kwargs: object) -> SandboxResult:
    """Blocking form of `run_python_sandboxed`, for callers without an event loop (scorers, scripts)."""
    return asyncio.run(run_python_sandboxed(code, **kwargs))  # type: ignore[arg-type]

"""Run untrusted Python code in an isolated subprocess; never in our own process.

The parent side: it prepares the directories and settings, starts the child (`child/boot.py`), reads its output
within a budget, and kills it on the wall-clock limit or on cancellation. What isolates the code is set up by
the child before any user code runs; `docs/tools.md` lists each guarantee and what enforces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import marshal
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from agentflow.errors import SandboxUnavailableError
from agentflow.tools.sandbox import cgroup, process_level
from agentflow.tools.sandbox.capture import Capture, drain
from agentflow.tools.sandbox.child import landlock
from agentflow.tools.sandbox.child.boot import REPORT_FD_VARIABLE
from agentflow.tools.sandbox.cleanup import remove_tree
from agentflow.tools.sandbox.levels import Isolation, explain_failure, unavailable_message, warn_process_level
from agentflow.tools.sandbox.policy import read_policy, tasks_of, unprivileged_identity

log = logging.getLogger(__name__)

_CHILD_ROOT = str(Path(__file__).parent)  # the folder holding the `child` package
# `-c` runs this: it imports the child package from our folder, then takes the folder off `sys.path`.
_LAUNCHER = "import sys; sys.path.insert(0, sys.argv[1]); from child import boot; del sys.path[0]; boot.main()"
_STOP_GRACE_S = 5.0
_CPU_POLL_S = 0.1  # how often the run's cgroup CPU time is read; the run may overrun its budget by about this
WORKDIR = "/sandbox"  # the working directory inside the kernel level's new root (a tmpfs of its own)
_kernel_checked: dict[str, str | None] = {}  # interpreter -> None when the kernel level works, else why not


class SandboxResult(BaseModel):
    """What one sandboxed run did. `exit_code` follows subprocess: negative means killed by that signal."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    signal: str | None = Field(None, description="Name of the signal that ended the process, if any.")
    timed_out: bool = Field(False, description="Killed by the wall-clock limit.")
    memory_error: bool = Field(False, description="The kernel's OOM killer acted in the run's cgroup (its memory "
                               "limit); never inferred from the code's output.")
    cpu_limit: bool = Field(False, description="The run used up its CPU time, as the kernel counted it.")
    cpu_seconds: float | None = Field(None, description="CPU time of the run (cgroup), else of the code's "
                                      "process and the children it waited for; None at the process level.")
    setup_error: str | None = Field(None, description="The sandbox could not be set up (reported by the "
                                    "sandbox itself, before any user code ran): `<step>: <error>`.")
    stdout_dropped_bytes: int = 0
    stderr_dropped_bytes: int = 0
    seconds: float = 0.0
    isolation: list[str] = Field(default_factory=list, description="The level, then the layers active in this run.")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        return bool(self.stdout_dropped_bytes or self.stderr_dropped_bytes)


async def check_isolation(python: str | None = None, isolation: Isolation = "kernel") -> None:
    """Raise SandboxUnavailableError, saying what is missing and how to enable it, when `isolation` cannot hold.

    The kernel level is tried once per interpreter (a run of `pass`); the process level only warns, once.
    """
    if isolation == "process":
        warn_process_level()
        return
    python = python or sys.executable
    if python not in _kernel_checked:
        probe = await _run(_payload("pass", {}), python=python, isolation="kernel", timeout_s=30.0, memory_mb=512,
                           max_output_chars=4000, cpu_s=None, max_file_mb=1, max_open_files=64, max_processes=4,
                           disk_mb=1, max_files=64, read_paths=(), network_namespace=False, drop_privileges=None,
                           on_start=None)
        # The probe runs our own `pass`: its stderr is read only when the sandbox could not even report.
        _kernel_checked[python] = None if probe.ok else explain_failure(
            f"agentflow-sandbox: {probe.setup_error}" if probe.setup_error else probe.stderr)
    if (reason := _kernel_checked[python]) is not None:
        raise SandboxUnavailableError(unavailable_message(reason))


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
    disk_mb: int = 64,
    max_files: int = 2048,
    python: str | None = None,
    isolation: Isolation = "kernel",
    read_paths: Sequence[str] = (),
    network_namespace: bool = True,
    drop_privileges: bool | None = None,
    on_start: Callable[[int], None] | None = None,
    names: dict[str, str | list[str]] | None = None,
) -> SandboxResult:
    """Run `code` once in a sandboxed `python -I` subprocess and report what happened.

    `names`: global variables bound before the code runs (strings or lists of strings), e.g. the python tool's
    `question` and `steps`; they travel with the code on stdin.

    Raises SandboxUnavailableError when the kernel lacks what `isolation` needs; otherwise never raises for
    anything the code does: a timeout, a crash or a limit is a field of the result. Cancelling the awaiting task
    kills every process the code started and removes the working directory. `max_output_chars` bounds each of
    stdout and stderr (counted in bytes); the head and tail are kept. `read_paths` adds folders or files the code
    may read at the kernel level. `network_namespace` and `drop_privileges` (None: drop to `nobody` when root
    and the interpreter allows it) concern the process level; the kernel level always has both.
    `on_start` receives the child's pid (which is also its process-group id).

    At the kernel level the run's bounds hold for all its processes together where a cgroup can be made
    (`memory_mb` of memory, `max_processes`, `cpu_s` of CPU time), and its working directory is a tmpfs of
    `disk_mb` and `max_files` that vanishes with the run; `docs/tools.md` says which mechanism holds each bound.
    """
    python = python or sys.executable
    await check_isolation(python, isolation)
    payload = _payload(code, names or {})
    return await _run(payload, python=python, isolation=isolation, timeout_s=timeout_s, memory_mb=memory_mb,
                      max_output_chars=max_output_chars, cpu_s=cpu_s, max_file_mb=max_file_mb,
                      max_open_files=max_open_files, max_processes=max_processes, disk_mb=disk_mb,
                      max_files=max_files, read_paths=read_paths,
                      network_namespace=network_namespace, drop_privileges=drop_privileges, on_start=on_start)


@functools.lru_cache(maxsize=1)
def _landlock_abi() -> int:
    """This kernel's Landlock ABI, for the record (the child checks it again and refuses without Landlock)."""
    try:
        return landlock.abi_version()
    except OSError:
        return 0


async def _settings(python: str, isolation: Isolation, base: str, read_paths: Sequence[str],
                    network_namespace: bool, drop_privileges: bool | None) -> tuple[dict, list[str], list[str], str]:
    """The child's settings (without limits), the layers for the result's record, the command prefix, and the
    folder on the host the child starts in."""
    if isolation == "kernel":
        identity = unprivileged_identity() if os.geteuid() == 0 else None
        policy = await asyncio.to_thread(read_policy, python, tuple(read_paths))
        workdir, root = os.path.join(base, "work"), os.path.join(base, "root")  # stay empty: mount points only
        os.mkdir(workdir, 0o700)
        os.mkdir(root, 0o700)
        layers = ["level:kernel", "user_namespace", "pid_namespace", "mount_namespace", "network_namespace",
                  "ipc_namespace", "uts_namespace", f"landlock:abi{_landlock_abi()}", "seccomp", "tmpfs_workdir",
                  "oom_score_adj:1000"]
        settings = {"level": "kernel", "dir": WORKDIR, "root": root, "read_paths": list(policy.paths),
                    "links": policy.links, "parent_pid": os.getpid()}
        prefix: tuple[str, ...] = ()
    else:
        identity = await asyncio.to_thread(process_level.drop_target, python) if drop_privileges is not False else None
        if drop_privileges and identity is None:
            log.warning("sandbox: cannot drop privileges (not root, or %s is not world-readable)", python)
        prefix = await asyncio.to_thread(process_level.netns_prefix, os.geteuid() == 0) if network_namespace else ()
        workdir = base
        layers = ["level:process", *(["network_namespace"] if prefix else [])]
        settings = {"level": "process", "dir": workdir}
    if identity:
        os.chown(workdir, *identity)
        layers.append(f"uid:{identity[0]}")
    settings.update(uid=identity[0] if identity else None, gid=identity[1] if identity else None)
    return settings, [*layers, "rlimits", "scrubbed_env", "tempdir", "audit_hook"], list(prefix), workdir


def _payload(code: str, names: dict[str, str | list[str]]) -> bytes:
    """The names and the code as the child reads them on stdin, after its settings: the length of the marshalled
    names, the names, then the source."""
    for name, value in names.items():
        if not name.isidentifier() or not (isinstance(value, str) or
                                           (isinstance(value, list) and all(isinstance(v, str) for v in value))):
            raise ValueError(f"sandbox name {name!r}: a string or a list of strings, under an identifier")
    packed = marshal.dumps(names, 4)
    return len(packed).to_bytes(8, "little") + packed + code.encode("utf-8", "replace")


class _Report:
    """What the sandbox's outer process reported on its own pipe; the code cannot write to it."""

    def __init__(self, text: str) -> None:
        lines = text.splitlines()
        self.setup_error = next((line.split(": ", 1)[1] for line in lines if line.startswith("agentflow-sandbox: ")),
                                None)
        values = dict(line.split(" ", 1) for line in lines if line.startswith(("status ", "cpu_s ")))
        self.cpu_seconds = float(values["cpu_s"]) if "cpu_s" in values else None


def _read_report(fd: int) -> _Report:
    """Whatever the outer process wrote before it exited (a few lines, far below a pipe's buffer)."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while len(data) < 65536 and (chunk := os.read(fd, 4096)):
            data += chunk
    return _Report(data.decode("utf-8", "replace"))


async def _run(code: bytes, *, python: str, isolation: Isolation, timeout_s: float, memory_mb: int,
               max_output_chars: int, cpu_s: float | None, max_file_mb: int, max_open_files: int,
               max_processes: int, disk_mb: int, max_files: int, read_paths: Sequence[str], network_namespace: bool,
               drop_privileges: bool | None, on_start: Callable[[int], None] | None) -> SandboxResult:
    # Without its own CPU limit, the wall clock (which CPU time cannot outrun) decides; the +1 keeps it so.
    cpu_seconds = max(1, math.ceil(cpu_s) if cpu_s is not None else math.ceil(timeout_s) + 1)
    base = tempfile.mkdtemp(prefix="agentflow-sandbox-")
    group: cgroup.RunCgroup | None = None
    try:
        settings, isolation_record, prefix, workdir = await _settings(python, isolation, base, read_paths,
                                                                      network_namespace, drop_privileges)
        if isolation == "kernel":  # counted in the sandbox's own user namespace: its processes, outer and init
            nproc = max_processes + 2
            group = cgroup.create(memory_mb * 1024 * 1024, nproc)
            isolation_record.insert(-4, f"cgroup:v{group.version}" if group else "no_cgroup")
            settings["cgroups"] = group.procs_files if group else []
            settings["work"] = {"bytes": disk_mb * 1024 * 1024, "files": max_files}
        else:  # counted per user across the machine; root ignores it, so only other users need the scan
            run_uid = settings["uid"] if settings["uid"] is not None else os.getuid()
            nproc = max_processes + (await asyncio.to_thread(tasks_of, run_uid) if run_uid != 0 else 0)
    except BaseException:
        remove_tree(base)
        raise
    # With the cgroup's exact count the parent ends the run at `cpu_seconds`; RLIMIT_CPU, a tick-sampled clock
    # that runs ahead of the exact one under load, is then only the backstop, a second later.
    backstop = 1 if group is not None and group.cpu_seconds() is not None else 0
    settings["rlimits"] = {
        # (soft, hard); the CPU soft limit sends SIGXCPU, the hard one a second later SIGKILL.
        "RLIMIT_CPU": (cpu_seconds + backstop, cpu_seconds + backstop + 1),
        "RLIMIT_FSIZE": (max_file_mb * 1024 * 1024,) * 2,
        "RLIMIT_NOFILE": (max_open_files,) * 2,
        "RLIMIT_NPROC": (nproc,) * 2,
        "RLIMIT_CORE": (0, 0),
    }
    if group is None:  # the cgroup counts what the run really uses; without one, each process's address space
        settings["rlimits"]["RLIMIT_AS"] = (memory_mb * 1024 * 1024,) * 2
    home = settings["dir"]
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        # Thread pools of numeric libraries count against RLIMIT_NPROC and the address-space limit.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }
    report_r, report_w = os.pipe()
    env[REPORT_FD_VARIABLE] = str(report_w)
    packed = marshal.dumps(settings, 4)
    payload = len(packed).to_bytes(8, "little") + packed + code
    argv = [*prefix, python, "-I", "-B", "-c", _LAUNCHER, _CHILD_ROOT]
    out, err = Capture(max_output_chars), Capture(max_output_chars)
    timed_out = cpu_hit = False
    start = time.perf_counter()
    proc: asyncio.subprocess.Process | None = None
    try:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=workdir, env=env, start_new_session=True, close_fds=True,
                pass_fds=(report_w,))
        finally:
            os.close(report_w)
        if on_start is not None:
            on_start(proc.pid)
        readers = [asyncio.create_task(drain(proc.stdout, out)), asyncio.create_task(drain(proc.stderr, err))]
        try:
            waiter = asyncio.create_task(_feed_and_wait(proc, payload))
            watcher = asyncio.create_task(_watch_cpu(group, cpu_seconds)) if group else None
            try:
                done, _ = await asyncio.wait([t for t in (waiter, watcher) if t], timeout=timeout_s,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (waiter, watcher):
                    if task is not None and not task.done():
                        task.cancel()
            if waiter not in done:
                cpu_hit = watcher in done
                timed_out = not cpu_hit
                await _stop(proc, isolation)
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
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(_stop(proc, isolation))
        report = _read_report(report_r)
        os.close(report_r)
        out_of_memory = group.out_of_memory() if group else False
        run_cpu = group.cpu_seconds() if group else None
        if group is not None and not group.remove(tries=1):  # busy a moment longer: wait off the event loop
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(asyncio.to_thread(group.remove))
        remove_tree(base)
    seconds = time.perf_counter() - start
    assert proc is not None
    exit_code = proc.returncode
    return SandboxResult(
        stdout=out.text(),
        stderr=err.text(),
        exit_code=exit_code,
        signal=_signal_name(exit_code),
        timed_out=timed_out,
        memory_error=out_of_memory,
        # RLIMIT_CPU's SIGXCPU follows the tick-sampled clock, which ran up to 6 % ahead of the exact counts
        # (rusage, cgroup) under load: 0.75 still tells a hit from code that signals itself early.
        cpu_limit=cpu_hit or any(used is not None and used >= 0.75 * cpu_seconds for used in (report.cpu_seconds,
                                                                                                run_cpu)),
        cpu_seconds=run_cpu if run_cpu is not None else report.cpu_seconds,
        setup_error=report.setup_error,
        stdout_dropped_bytes=out.dropped,
        stderr_dropped_bytes=err.dropped,
        seconds=seconds,
        isolation=isolation_record,
    )


async def _watch_cpu(group: cgroup.RunCgroup, limit_s: float) -> None:
    """Returns when the run's processes together have used `limit_s` of CPU time (never, without accounting)."""
    while True:
        await asyncio.sleep(_CPU_POLL_S)
        used = group.cpu_seconds()
        if used is None:
            await asyncio.Event().wait()
        elif used >= limit_s:
            return


async def _feed_and_wait(proc: asyncio.subprocess.Process, payload: bytes) -> int:
    """Hand the code to the child on stdin, then wait for the exit; both count against the wall clock."""
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the child may already be gone
        proc.stdin.write(payload)
        await proc.stdin.drain()
        proc.stdin.close()
    return await proc.wait()


async def _stop(proc: asyncio.subprocess.Process, isolation: Isolation) -> None:
    """End the run and everything it started; returns once they are gone.

    At the kernel level SIGTERM asks the child's outer process (which the code cannot reach) to kill the PID
    namespace and wait until the kernel has removed it; SIGKILL to the group is the fallback.
    """
    if isolation == "kernel" and proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=_STOP_GRACE_S)
    _kill_group(proc.pid)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(proc.wait(), timeout=_STOP_GRACE_S)


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


def run_python_sandboxed_sync(code: str, **kwargs: object) -> SandboxResult:
    """Blocking form of `run_python_sandboxed`, for callers without an event loop (scorers, scripts)."""
    return asyncio.run(run_python_sandboxed(code, **kwargs))  # type: ignore[arg-type]

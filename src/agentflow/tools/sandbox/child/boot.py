"""The child's entry point: limits, isolation, then the user's code.

At the kernel level three processes take part:

* the *outer* process (the one the parent started): creates the namespaces, forks, waits and reports the exit
  status; on SIGTERM it kills the namespace's first process and waits until the kernel has removed them all;
* *init*, PID 1 of the new PID namespace: builds the new root, drops to the unprivileged user (in a user
  namespace of its own, when we start as root), applies the limits, Landlock and seccomp, forks the user's
  process, reaps orphans, and sends the user's exit status to the outer process. When it dies (its parent's
  death kills it too) the kernel kills every process in the namespace;
* the *user* process: a nested Landlock domain of its own (it cannot signal or trace init), then the code.

The outer process alone reports to the parent, on the report pipe (`AGENTFLOW_SANDBOX_REPORT_FD`, closed in init
before any user code exists): `status N` (the user's wait status), `cpu_s X` (its CPU time, from the kernel's
rusage) or `agentflow-sandbox: <step>: <error>` when a step of the set-up failed. Nothing the code prints or
the way it exits can forge these lines; stderr gets a copy of a set-up failure for the user only.
"""

from __future__ import annotations

# The C module: `signal` wraps it in enums, whose import costs milliseconds at every start.
import _signal as signal
import marshal
import os
import resource
import select
import sys

from . import landlock, mounts, run_code, seccomp
from .linux import PR_SET_DUMPABLE, PR_SET_PDEATHSIG, drop_capabilities, prctl

SETUP_FAILED = 125


REPORT_FD_VARIABLE = "AGENTFLOW_SANDBOX_REPORT_FD"
_channel = -1  # where a set-up failure is reported: the report pipe in the outer process, the status pipe after


class _Step:
    """Names the step being set up, so that a failure says which mechanism is missing."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, err: BaseException | None, tb: object) -> bool:
        if err is not None and isinstance(err, OSError):
            line = f"agentflow-sandbox: {self.name}: {err}\n".encode()
            if _channel >= 0:
                _write_all(_channel, line)
            os.write(2, line)
            os._exit(SETUP_FAILED)
        return False


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass  # the reader is gone: the parent has stopped waiting for this run


def _set_limits(rlimits: dict[str, list[int]]) -> None:
    for name, (soft, hard) in rlimits.items():
        res = getattr(resource, name)
        limit = resource.getrlimit(res)[1]
        if limit != resource.RLIM_INFINITY:
            soft, hard = min(soft, limit), min(hard, limit)
        try:
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError) as err:
            sys.stderr.write(f"sandbox: could not set {name}: {err}\n")


def _drop_to(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _exit_like(status: int) -> None:
    """Leave this process the way a wait status says the child left (exit code or signal)."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
        os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else SETUP_FAILED)


def _landlock_rules(cfg: dict, has_proc: bool) -> list[tuple[str, int]]:
    rules = [(path, landlock.READ) for path in cfg["read_paths"]]
    rules += [(device, landlock.READ_FILE) for device in mounts.DEVICES if os.path.exists(device)]
    rules.append(("/dev/null", landlock.READ_FILE | landlock.WRITE_FILE | landlock.TRUNCATE))
    rules.append((cfg["dir"], landlock.WRITE))
    if has_proc:
        rules.append(("/proc", landlock.READ))
    return rules


def _outer(cfg: dict) -> int:
    """Create the namespaces and fork init; returns init's pid (in the outer process) after the fork."""
    with _Step("parent watch"):
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # if agentflow dies, we end the run as on a timeout
    if os.getppid() != cfg.pop("parent_pid"):  # popped: the code, a fork of us, need not learn a host pid
        os._exit(SETUP_FAILED)  # the parent died before we could watch it
    for procs in cfg["cgroups"]:  # before any fork: every process of the run is counted in the run's cgroups
        with _Step("cgroup"), open(procs, "w") as handle:
            handle.write(str(os.getpid()))
    flags = mounts.CLONE_NEWNS | mounts.CLONE_NEWPID | mounts.CLONE_NEWNET | mounts.CLONE_NEWIPC
    flags |= mounts.CLONE_NEWUTS
    as_root = os.geteuid() == 0
    with _Step("namespaces (unshare)"):
        mounts.unshare(flags if as_root else flags | mounts.CLONE_NEWUSER)
        if not as_root:
            mounts.map_to_self(os.geteuid(), os.getegid())
    return os.fork()


def _init(cfg: dict, status_w: int, alive_r: int) -> None:
    """PID 1 of the namespace: set everything up, run the user's process, report its status. Never returns."""
    global _channel
    _channel = status_w
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    with _Step("host name (UTS namespace)"):
        mounts.set_host_name()
    with _Step("OOM score"):  # the kernel's OOM killer takes the code's processes first, never agentflow
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    mounts.limit_ipc()
    owner = (cfg["uid"], cfg["gid"]) if cfg["uid"] is not None else (os.geteuid(), os.getegid())
    with _Step("new root (mount namespace)"):
        has_proc = mounts.build_root(cfg["root"], cfg["read_paths"], cfg["links"], cfg["dir"], cfg["work"], owner)
        os.chdir(cfg["dir"])
    if cfg["uid"] is not None:
        with _Step("privilege drop"):
            _drop_to(cfg["uid"], cfg["gid"])
            prctl(PR_SET_DUMPABLE, 1)  # the uid change hid our /proc entries, which the id maps are written to
        # A user namespace of our own: RLIMIT_NPROC counts per (namespace, uid), so only this sandbox's processes.
        with _Step("namespaces (user namespace)"):
            mounts.unshare(mounts.CLONE_NEWUSER)
            mounts.map_to_self(cfg["uid"], cfg["gid"])
    with _Step("privilege drop"):
        drop_capabilities()  # also those a new user namespace grants its creator
        prctl(PR_SET_DUMPABLE, 0)  # the user's process may not open our /proc entries
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the changes of identity, which clear it
    if select.select([alive_r], [], [], 0)[0]:
        os._exit(SETUP_FAILED)  # end of file: the outer process died before the watch was set
    _set_limits(cfg["rlimits"])
    with _Step("landlock"):
        landlock.restrict_self(_landlock_rules(cfg, has_proc))
    with _Step("seccomp"):
        seccomp.install()
    with _Step("fork"):
        user = os.fork()
    if user == 0:
        os.close(alive_r)
        prctl(PR_SET_DUMPABLE, 1)  # its own /proc/self entries readable again (the uid change had hidden them)
        with _Step("landlock (user domain)"):
            landlock.restrict_self(_landlock_rules(cfg, has_proc))
        os.close(status_w)
        _channel = -1
        return
    status, cpu_s = SETUP_FAILED << 8, 0.0
    while True:  # reap orphans until the user's process ends; then the kernel removes the rest
        try:
            pid, each, usage = os.wait4(-1, 0)
        except ChildProcessError:
            break
        if pid == user:  # its CPU time, with that of the children it waited for, as the kernel counted it
            status, cpu_s = each, usage.ru_utime + usage.ru_stime
            break
    _write_all(status_w, f"status {status}\ncpu_s {cpu_s:.3f}\n".encode())
    os._exit(0)


def _kernel_level(cfg: dict) -> None:
    """Returns only in the user's process, fully isolated; the outer process and init end in os._exit."""
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    status_r, status_w = os.pipe()
    alive_r, alive_w = os.pipe()
    init = _outer(cfg)
    if init == 0:
        os.close(status_r)
        os.close(alive_w)
        if cfg["report_fd"] >= 0:  # the parent's channel: nothing after this point can write to it
            os.close(cfg["report_fd"])
        _init(cfg, status_w, alive_r)
        return
    os.close(status_w)
    os.close(alive_r)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(init, signal.SIGKILL))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    _, status = os.waitpid(init, 0)  # returns once every process of the namespace is gone
    reported = b""
    while chunk := os.read(status_r, 4096):
        reported += chunk
    _write_all(cfg["report_fd"], reported)
    found = [line.split()[1] for line in reported.decode(errors="replace").splitlines() if line.startswith("status ")]
    _exit_like(int(found[0]) if found else status)


def main() -> None:
    """Read the parent's settings, the names and the code from stdin (each `marshal`led after its length: not on
    the command line, which /proc shows), then isolate and run."""
    global _channel
    payload = sys.stdin.buffer.read()
    size = int.from_bytes(payload[:8], "little")
    cfg = marshal.loads(payload[8:8 + size])
    rest = payload[8 + size:]
    size = int.from_bytes(rest[:8], "little")
    names = marshal.loads(rest[8:8 + size])
    source = rest[8 + size:].decode("utf-8", "replace")
    del payload, rest
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    cfg["report_fd"] = int(os.environ.pop(REPORT_FD_VARIABLE, "-1"))
    if cfg["level"] == "kernel":
        _channel = cfg["report_fd"]
        _kernel_level(cfg)
    else:
        if cfg["report_fd"] >= 0:
            os.close(cfg["report_fd"])  # the process level reports nothing the code could not also write
        _set_limits(cfg["rlimits"])
        if cfg["uid"] is not None:
            _drop_to(cfg["uid"], cfg["gid"])
    workdir = cfg["dir"]
    cfg.clear()  # the settings name host paths; the code can reach every object of its interpreter
    run_code.run(source, workdir, names)

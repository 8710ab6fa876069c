"""The child's entry point: limits, isolation, then the user's code.

At the kernel level three processes take part:

* the *outer* process (the one the parent started): creates the namespaces, forks, waits and reports the exit
  status; on SIGTERM it kills the namespace's first process and waits until the kernel has removed them all;
* *init*, PID 1 of the new PID namespace: builds the new root, drops to the unprivileged user (in a user
  namespace of its own, when we start as root), applies the limits, Landlock and seccomp, forks the user's
  process, reaps orphans, and sends the user's exit status to the outer process. When it dies (its parent's
  death kills it too) the kernel kills every process in the namespace;
* the *user* process: a nested Landlock domain of its own (it cannot signal or trace init), then the code.

A failure to set something up ends the run with exit status 125 and one line `agentflow-sandbox: <step>: <error>`
on stderr before any user code has run.
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


class _Step:
    """Names the step being set up, so that a failure says which mechanism is missing."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, err: BaseException | None, tb: object) -> bool:
        if err is not None and isinstance(err, OSError):
            os.write(2, f"agentflow-sandbox: {self.name}: {err}\n".encode())
            os._exit(SETUP_FAILED)
        return False


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
    if os.getppid() != cfg["parent_pid"]:
        os._exit(SETUP_FAILED)  # the parent died before we could watch it
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
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    with _Step("new root (mount namespace)"):
        has_proc = mounts.build_root(cfg["root"], cfg["read_paths"], cfg["links"], cfg["dir"])
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
        os.close(status_w)
        os.close(alive_r)
        prctl(PR_SET_DUMPABLE, 1)  # its own /proc/self entries readable again (the uid change had hidden them)
        with _Step("landlock (user domain)"):
            landlock.restrict_self(_landlock_rules(cfg, has_proc))
        return
    status = SETUP_FAILED << 8
    while True:  # reap orphans until the user's process ends; then the kernel removes the rest
        try:
            pid, each = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == user:
            status = each
            break
    os.write(status_w, status.to_bytes(4, "little"))
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
        _init(cfg, status_w, alive_r)
        return
    os.close(status_w)
    os.close(alive_r)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(init, signal.SIGKILL))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    _, status = os.waitpid(init, 0)  # returns once every process of the namespace is gone
    reported = os.read(status_r, 4)
    _exit_like(int.from_bytes(reported, "little") if len(reported) == 4 else status)


def main(config: str) -> None:
    """Run with the parent's settings (`marshal`, hex-encoded: no import needed to read them)."""
    cfg = marshal.loads(bytes.fromhex(config))
    payload = sys.stdin.buffer.read()
    size = int.from_bytes(payload[:8], "little")
    names = marshal.loads(payload[8:8 + size])
    source = payload[8 + size:].decode("utf-8", "replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if cfg["level"] == "kernel":
        _kernel_level(cfg)
    else:
        _set_limits(cfg["rlimits"])
        if cfg["uid"] is not None:
            _drop_to(cfg["uid"], cfg["gid"])
    run_code.run(source, cfg["dir"], names)

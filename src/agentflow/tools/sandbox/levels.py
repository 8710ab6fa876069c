"""Isolation levels of the sandbox, and what to tell a user whose kernel lacks a mechanism."""

from __future__ import annotations

import errno
import functools
import logging
import re
from typing import Literal

log = logging.getLogger(__name__)

Isolation = Literal["kernel", "process"]
"""`kernel`: namespaces, Landlock and seccomp hold against hostile code. `process`: audit hook and limits only."""

_HINTS = {
    "namespaces": (
        "new namespaces were refused. Run as root, or allow unprivileged user namespaces "
        "(sysctl user.max_user_namespaces=15000; on Debian kernels kernel.unprivileged_userns_clone=1; on Ubuntu "
        "24.04+ kernel.apparmor_restrict_unprivileged_userns=0). In a container, allow unshare and mount, e.g. "
        "docker run --cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt apparmor=unconfined"),
    "new root": (
        "mounting inside the new mount namespace was refused (a container without CAP_SYS_ADMIN, or an "
        "AppArmor/SELinux policy); allow mount in the container as for namespaces"),
    "privilege drop": "the switch to an unprivileged user or the removal of capabilities was refused",
    "landlock": (
        "Landlock is needed (Linux 5.13+ built with CONFIG_SECURITY_LANDLOCK=y). If it is built in but off, add "
        "it to the kernel's boot parameter, e.g. lsm=landlock,lockdown,yama,integrity,apparmor,bpf"),
    "seccomp": "seccomp filters are needed (CONFIG_SECCOMP_FILTER=y, on x86_64 or aarch64)",
    "host name": "setting the host name in the run's new UTS namespace was refused (allow it as for namespaces)",
    "OOM score": "raising /proc/self/oom_score_adj was refused (a read-only /proc, or a policy that forbids it)",
    "cgroup": ("joining the run's cgroup was refused after it was made (a policy on cgroup.procs, or the cgroup "
               "was removed meanwhile)"),
}
_NOT_BUILT = {errno.ENOSYS: "not built into this kernel", errno.EOPNOTSUPP: "built in but not enabled at boot"}
_STEP = re.compile(r"^agentflow-sandbox: (?P<step>[^:]+): (?P<error>.*)$", re.MULTILINE)


def explain_failure(stderr: str) -> str:
    """A user-facing explanation of a failed kernel set-up, from the child's `agentflow-sandbox:` line."""
    match = _STEP.search(stderr)
    if match is None:
        detail = stderr.strip()[-500:] or "no message"
        return f"the sandbox could not start ({detail})"
    step, error = match["step"], match["error"]
    hint = next((text for key, text in _HINTS.items() if step.startswith(key)), "")
    code = re.match(r"\[Errno (\d+)\]", error)
    if step == "landlock" and code and int(code[1]) in _NOT_BUILT:
        error += f" (Landlock is {_NOT_BUILT[int(code[1])]})"
    return f"{step}: {error}. {hint}".rstrip(". ") + "."


def unavailable_message(explanation: str) -> str:
    return (f"The python tool's sandbox cannot isolate code on this machine: {explanation} "
            "To run model-written code with process-level isolation instead (resource limits and an audit hook "
            "only; it does not hold against hostile code), set `isolation: process` for the tool "
            "(tools.python.isolation in the flow config).")


@functools.lru_cache(maxsize=1)
def warn_process_level() -> None:
    """Once per process: the user chose the weaker level; every result also records it."""
    log.warning("python sandbox at the 'process' isolation level: model-written code can switch off its audit "
                "hook and then write files, run programs and signal processes with this user's rights")

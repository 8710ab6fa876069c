"""A seccomp allowlist: the system calls the code may make. Every other call fails, whatever it does in Python.

On the list: what CPython, its standard library and numeric packages (numpy, sympy) need to compute, run
threads, fork, use files (the mounts and Landlock judge which), wait on descriptors, keep time and talk to its
own processes over UNIX sockets; and the Landlock calls of our own set-up after the filter (they can only
restrict further). A call off the list fails with EPERM, never a kill, so Python raises a clean
`PermissionError`; a number above `LAST_KNOWN` (the last call of Linux 6.1) fails with ENOSYS, as on an older
kernel, so libc falls back. `docs/tools.md` says what is left out and why.

Classic BPF over `seccomp_data` (nr at offset 0, arch at 4, argument i at 16 + 8 i). The filter is inherited
by every descendant and cannot be removed.
"""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Iterable

from .linux import AUDIT_ARCH, LAST_KNOWN, MACHINE, NUMBERS, PR_SET_NO_NEW_PRIVS, check, libc, prctl

# Names as the kernel's tables spell them; a name an architecture lacks (aarch64 has no `open`, `fork`, ...) is
# skipped there.
ALLOWED = (
    # Descriptors and files. Which paths can be read or written is for the mounts and Landlock to say.
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2",
    "open", "openat", "openat2", "creat", "close", "close_range", "dup", "dup2", "dup3", "fcntl", "ioctl",
    "flock", "lseek", "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access",
    "faccessat", "faccessat2", "readlink", "readlinkat", "getdents", "getdents64", "getcwd", "chdir", "fchdir",
    "mkdir", "mkdirat", "mknod", "mknodat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2",
    "link", "linkat", "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "umask", "truncate", "ftruncate",
    "fallocate", "fsync", "fdatasync", "sync_file_range", "fadvise64", "readahead", "utime", "utimes",
    "futimesat", "utimensat", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
    "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr", "sendfile",
    "copy_file_range", "pipe", "pipe2",
    # Waiting for descriptors, events and timers.
    "select", "pselect6", "poll", "ppoll", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait",
    "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2", "timerfd_create", "timerfd_settime", "timerfd_gettime",
    # Its own memory.
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "msync", "mincore", "membarrier", "get_mempolicy",
    # Threads, processes and signals (the PID namespace and Landlock keep them among the run's own processes).
    "fork", "vfork", "exit", "exit_group", "wait4", "waitid", "set_tid_address", "set_robust_list", "rseq",
    "futex", "futex_waitv", "gettid", "getpid", "getppid", "getpgrp", "getpgid", "setpgid", "getsid", "setsid",
    "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups", "capget", "kill", "tkill",
    "tgkill", "pidfd_open", "pidfd_send_signal", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn",
    "rt_sigpending", "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "rt_sigsuspend", "sigaltstack",
    "signalfd", "signalfd4", "restart_syscall", "pause", "sched_yield", "sched_getaffinity", "sched_setaffinity",
    "sched_getparam", "sched_setparam", "sched_getscheduler", "sched_setscheduler", "sched_get_priority_max",
    "sched_get_priority_min", "sched_rr_get_interval", "sched_getattr", "sched_setattr", "getpriority",
    "setpriority", "getcpu", "arch_prctl",
    # Time.
    "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "time", "times", "alarm",
    "getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime", "timer_getoverrun", "timer_delete",
    # Its limits and usage, the machine's name, load and randomness.
    "getrlimit", "setrlimit", "prlimit64", "getrusage", "sysinfo", "uname", "getrandom",
    # UNIX sockets among its own processes (`socket` and `socketpair` are judged below; no connect or accept).
    "bind", "sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "shutdown", "getsockname",
    "getpeername", "setsockopt", "getsockopt",
    # The user process's own Landlock domain, set up after the filter.
    "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
)
_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_AF_UNIX = 1
_PERSONALITY_QUERY = 0xFFFFFFFF
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2

_LD_W_ABS, _JEQ, _JGT, _JGE, _JSET, _RET = 0x20, 0x15, 0x25, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS = 0x7FFF0000, 0x80000000
_ARG0 = 16
_X32_BIT = 0x40000000

# Calls allowed for some values of their first argument: (name, test that jumps one further to allow).
_JUDGED = (
    # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: threads and forks, no new namespaces.
    ("clone", (_JSET, 0, 1, _NAMESPACE_FLAGS)),
    ("prctl", (_JEQ, 0, 1, 1)),  # not PR_SET_PDEATHSIG: the parent's death must go on killing us
    ("socket", (_JEQ, 1, 0, _AF_UNIX)),  # UNIX sockets only (asyncio's self-pipe, multiprocessing)
    ("socketpair", (_JEQ, 1, 0, _AF_UNIX)),
    ("personality", (_JEQ, 1, 0, _PERSONALITY_QUERY)),  # reading it, not changing it
)


def _errno(code: int) -> int:
    return 0x00050000 | code


def _ranges(numbers: Iterable[int]) -> list[tuple[int, int]]:
    """Runs of consecutive numbers, ascending, as (first, last)."""
    runs: list[tuple[int, int]] = []
    for number in sorted(set(numbers)):
        if runs and runs[-1][1] == number - 1:
            runs[-1] = (runs[-1][0], number)
        else:
            runs.append((number, number))
    return runs


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def program() -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions for this machine; OSError on an architecture we lack."""
    if MACHINE not in AUDIT_ARCH:
        raise OSError(errno.ENOSYS, f"seccomp: no filter written for {MACHINE}")
    allow, deny = (_RET, 0, 0, _ALLOW), (_RET, 0, 0, _errno(errno.EPERM))
    prog = [(_LD_W_ABS, 0, 0, 4), (_JEQ, 1, 0, AUDIT_ARCH[MACHINE]), (_RET, 0, 0, _KILL_PROCESS),
            (_LD_W_ABS, 0, 0, 0)]
    if MACHINE == "x86_64":  # the x32 ABI numbers the same calls differently
        prog += [(_JGE, 0, 1, _X32_BIT), deny]
    prog += [(_JGT, 0, 1, LAST_KNOWN), (_RET, 0, 0, _errno(errno.ENOSYS))]  # unknown to this filter
    # clone3 passes its flags in memory the filter cannot read: "not implemented" makes libc fall back to clone.
    prog += [(_JEQ, 0, 1, NUMBERS["clone3"]), (_RET, 0, 0, _errno(errno.ENOSYS))]
    # Each judged block ends in a return, so `nr` need not be reloaded after it.
    for name, test in _JUDGED:
        if name in NUMBERS:
            prog += [(_JEQ, 0, 4, NUMBERS[name]), (_LD_W_ABS, 0, 0, _ARG0), test, deny, allow]
    # The allowed numbers as ascending runs: past a run's end, try the next; else allowed unless below its start.
    for first, last in _ranges(NUMBERS[name] for name in ALLOWED if name in NUMBERS):
        prog += [(_JGT, 3, 0, last), (_JGE, 1, 0, first), deny, allow]
    return [*prog, deny]


def install() -> None:
    """Apply the filter to this process and all it starts, for good (sets no_new_privs, which it requires)."""
    instructions = program()
    array = (_Instruction * len(instructions))(*(_Instruction(*i) for i in instructions))
    fprog = _Program(len(instructions), array)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")

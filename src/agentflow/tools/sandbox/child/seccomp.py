"""A seccomp filter: system calls the untrusted code never needs fail with EPERM, whatever it does in Python.

An allowlist of what Linux 6.1 knew (numbers up to `LAST_KNOWN`), less the calls below: a call a later kernel
adds fails with ENOSYS until it is judged here, so libc falls back as on an older kernel.

Classic BPF over `seccomp_data` (nr at offset 0, arch at 4, argument i at 16 + 8 i). The filter is inherited
by every descendant and cannot be removed.
"""

from __future__ import annotations

import ctypes
import errno

from .linux import AUDIT_ARCH, LAST_KNOWN, MACHINE, NUMBERS, PR_SET_NO_NEW_PRIVS, check, libc, prctl

# Debugging and reading other processes, new namespaces and mounts, kernel keyrings, modules, BPF, perf,
# io_uring (its requests would bypass this filter), and servers or clients of any socket.
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "unshare", "setns", "mount", "umount2",
    "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "connect", "accept", "accept4", "listen", "personality", "acct",
    "swapon", "swapoff", "reboot",
    # Memory no address-space limit counts (memfd, System V shared memory), the other System V and POSIX IPC,
    # watches on host activity in the bound folders (inotify, fanotify), and x86 segment descriptors.
    "memfd_create", "memfd_secret", "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl",
    "semget", "semop", "semtimedop", "semctl", "mq_open", "inotify_init", "inotify_init1", "inotify_add_watch",
    "fanotify_init", "fanotify_mark", "modify_ldt",
    # Host facts, clocks, NUMA placement, handles that bypass paths, and calls obsolete or reserved.
    "syslog", "iopl", "ioperm", "open_by_handle_at", "name_to_handle_at", "kcmp", "lookup_dcookie", "quotactl",
    "quotactl_fd", "nfsservctl", "vhangup", "uselib", "ustat", "sysfs", "_sysctl", "settimeofday",
    "clock_settime", "adjtimex", "clock_adjtime", "sethostname", "setdomainname", "mbind", "set_mempolicy",
    "set_mempolicy_home_node", "migrate_pages", "move_pages", "process_madvise", "process_mrelease",
    "remap_file_pages", "create_module", "get_kernel_syms", "query_module", "afs_syscall", "tuxcall", "security",
    "putpmsg", "getpmsg", "epoll_ctl_old", "epoll_wait_old", "vserver", "uretprobe",
)
_X86_ONLY = frozenset({  # aarch64 has no such calls
    "inotify_init", "modify_ldt", "iopl", "ioperm", "uselib", "ustat", "sysfs", "_sysctl", "create_module",
    "get_kernel_syms", "query_module", "afs_syscall", "tuxcall", "security", "putpmsg", "getpmsg", "epoll_ctl_old",
    "epoll_wait_old", "vserver", "uretprobe",
})
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_X32_BIT = 0x40000000
_AF_UNIX = 1
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2

_LD_W_ABS, _JEQ, _JGT, _JGE, _JSET, _RET = 0x20, 0x15, 0x25, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS = 0x7FFF0000, 0x80000000
_ARG0 = 16


def _errno(code: int) -> int:
    return 0x00050000 | code


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
    for name in DENIED:
        if name in _X86_ONLY and MACHINE != "x86_64":
            continue
        prog += [(_JEQ, 0, 1, NUMBERS[name]), deny]
    # clone3 passes its flags in memory the filter cannot read: "not implemented" makes libc fall back to clone.
    prog += [(_JEQ, 0, 1, NUMBERS["clone3"]), (_RET, 0, 0, _errno(errno.ENOSYS))]
    # Calls judged by their first argument; each block ends in a return, so `nr` need not be reloaded.
    judged = (
        ("clone", (_JSET, 0, 1, _NAMESPACE_FLAGS)),  # no new namespaces through clone either
        ("prctl", (_JEQ, 0, 1, 1)),  # PR_SET_PDEATHSIG: the parent's death must go on killing us
        ("socket", (_JEQ, 1, 0, _AF_UNIX)),  # only UNIX sockets (socketpair, asyncio's self-pipe)
    )
    for name, test in judged:
        prog += [(_JEQ, 0, 4, NUMBERS[name]), (_LD_W_ABS, 0, 0, _ARG0), test, deny, allow]
    return [*prog, allow]


def install() -> None:
    """Apply the filter to this process and all it starts, for good (sets no_new_privs, which it requires)."""
    instructions = program()
    array = (_Instruction * len(instructions))(*(_Instruction(*i) for i in instructions))
    fprog = _Program(len(instructions), array)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")

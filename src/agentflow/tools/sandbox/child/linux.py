"""The few Linux system calls the sandbox needs that Python 3.11's `os` lacks, through ctypes."""

from __future__ import annotations

import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# The numbers of the calls the seccomp filter allows or judges and of those the set-up makes, from the kernel's
# tables (arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h for aarch64; checked
# against the installed headers by tests/tools/sandbox/test_seccomp_allowlist.py). Numbers differ between
# architectures, except for calls added since Linux 5.1 (424 and up).
_NUMBERS = {
    "x86_64": {
        "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "fstat": 5, "lstat": 6, "poll": 7, "lseek": 8,
        "mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12, "rt_sigaction": 13, "rt_sigprocmask": 14,
        "rt_sigreturn": 15, "ioctl": 16, "pread64": 17, "pwrite64": 18, "readv": 19, "writev": 20, "access": 21,
        "pipe": 22, "select": 23, "sched_yield": 24, "mremap": 25, "msync": 26, "mincore": 27, "madvise": 28, "dup": 32,
        "dup2": 33, "pause": 34, "nanosleep": 35, "getitimer": 36, "alarm": 37, "setitimer": 38, "getpid": 39,
        "sendfile": 40, "socket": 41, "sendto": 44, "recvfrom": 45, "sendmsg": 46, "recvmsg": 47, "shutdown": 48,
        "bind": 49, "getsockname": 51, "getpeername": 52, "socketpair": 53, "setsockopt": 54, "getsockopt": 55,
        "clone": 56, "fork": 57, "vfork": 58, "exit": 60, "wait4": 61, "kill": 62, "uname": 63, "fcntl": 72,
        "flock": 73, "fsync": 74, "fdatasync": 75, "truncate": 76, "ftruncate": 77, "getdents": 78, "getcwd": 79,
        "chdir": 80, "fchdir": 81, "rename": 82, "mkdir": 83, "rmdir": 84, "creat": 85, "link": 86, "unlink": 87,
        "symlink": 88, "readlink": 89, "chmod": 90, "fchmod": 91, "umask": 95, "gettimeofday": 96, "getrlimit": 97,
        "getrusage": 98, "sysinfo": 99, "times": 100, "getuid": 102, "getgid": 104, "geteuid": 107, "getegid": 108,
        "setpgid": 109, "getppid": 110, "getpgrp": 111, "setsid": 112, "getgroups": 115, "getresuid": 118,
        "getresgid": 120, "getpgid": 121, "getsid": 124, "capget": 125, "rt_sigpending": 127, "rt_sigtimedwait": 128,
        "rt_sigqueueinfo": 129, "rt_sigsuspend": 130, "sigaltstack": 131, "utime": 132, "mknod": 133,
        "personality": 135, "statfs": 137, "fstatfs": 138, "getpriority": 140, "setpriority": 141,
        "sched_setparam": 142, "sched_getparam": 143, "sched_setscheduler": 144, "sched_getscheduler": 145,
        "sched_get_priority_max": 146, "sched_get_priority_min": 147, "sched_rr_get_interval": 148, "pivot_root": 155,
        "prctl": 157, "arch_prctl": 158, "setrlimit": 160, "gettid": 186, "readahead": 187, "setxattr": 188,
        "lsetxattr": 189, "fsetxattr": 190, "getxattr": 191, "lgetxattr": 192, "fgetxattr": 193, "listxattr": 194,
        "llistxattr": 195, "flistxattr": 196, "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
        "tkill": 200, "time": 201, "futex": 202, "sched_setaffinity": 203, "sched_getaffinity": 204,
        "epoll_create": 213, "getdents64": 217, "set_tid_address": 218, "restart_syscall": 219, "fadvise64": 221,
        "timer_create": 222, "timer_settime": 223, "timer_gettime": 224, "timer_getoverrun": 225, "timer_delete": 226,
        "clock_gettime": 228, "clock_getres": 229, "clock_nanosleep": 230, "exit_group": 231, "epoll_wait": 232,
        "epoll_ctl": 233, "tgkill": 234, "utimes": 235, "get_mempolicy": 239, "waitid": 247, "openat": 257,
        "mkdirat": 258, "mknodat": 259, "futimesat": 261, "newfstatat": 262, "unlinkat": 263, "renameat": 264,
        "linkat": 265, "symlinkat": 266, "readlinkat": 267, "fchmodat": 268, "faccessat": 269, "pselect6": 270,
        "ppoll": 271, "set_robust_list": 273, "sync_file_range": 277, "utimensat": 280, "epoll_pwait": 281,
        "signalfd": 282, "timerfd_create": 283, "eventfd": 284, "fallocate": 285, "timerfd_settime": 286,
        "timerfd_gettime": 287, "signalfd4": 289, "eventfd2": 290, "epoll_create1": 291, "dup3": 292, "pipe2": 293,
        "preadv": 295, "pwritev": 296, "rt_tgsigqueueinfo": 297, "recvmmsg": 299, "prlimit64": 302, "sendmmsg": 307,
        "getcpu": 309, "sched_setattr": 314, "sched_getattr": 315, "renameat2": 316, "getrandom": 318,
        "membarrier": 324, "copy_file_range": 326, "preadv2": 327, "pwritev2": 328, "statx": 332, "rseq": 334,
    },
    "aarch64": {
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "getxattr": 8, "lgetxattr": 9, "fgetxattr": 10, "listxattr": 11,
        "llistxattr": 12, "flistxattr": 13, "removexattr": 14, "lremovexattr": 15, "fremovexattr": 16, "getcwd": 17,
        "eventfd2": 19, "epoll_create1": 20, "epoll_ctl": 21, "epoll_pwait": 22, "dup": 23, "dup3": 24, "fcntl": 25,
        "ioctl": 29, "flock": 32, "mknodat": 33, "mkdirat": 34, "unlinkat": 35, "symlinkat": 36, "linkat": 37,
        "renameat": 38, "pivot_root": 41, "statfs": 43, "fstatfs": 44, "truncate": 45, "ftruncate": 46, "fallocate": 47,
        "faccessat": 48, "chdir": 49, "fchdir": 50, "fchmod": 52, "fchmodat": 53, "openat": 56, "close": 57,
        "pipe2": 59, "getdents64": 61, "lseek": 62, "read": 63, "write": 64, "readv": 65, "writev": 66, "pread64": 67,
        "pwrite64": 68, "preadv": 69, "pwritev": 70, "sendfile": 71, "pselect6": 72, "ppoll": 73, "signalfd4": 74,
        "readlinkat": 78, "newfstatat": 79, "fstat": 80, "fsync": 82, "fdatasync": 83, "sync_file_range": 84,
        "timerfd_create": 85, "timerfd_settime": 86, "timerfd_gettime": 87, "utimensat": 88, "capget": 90,
        "personality": 92, "exit": 93, "exit_group": 94, "waitid": 95, "set_tid_address": 96, "futex": 98,
        "set_robust_list": 99, "nanosleep": 101, "getitimer": 102, "setitimer": 103, "timer_create": 107,
        "timer_gettime": 108, "timer_getoverrun": 109, "timer_settime": 110, "timer_delete": 111, "clock_gettime": 113,
        "clock_getres": 114, "clock_nanosleep": 115, "sched_setparam": 118, "sched_setscheduler": 119,
        "sched_getscheduler": 120, "sched_getparam": 121, "sched_setaffinity": 122, "sched_getaffinity": 123,
        "sched_yield": 124, "sched_get_priority_max": 125, "sched_get_priority_min": 126, "sched_rr_get_interval": 127,
        "restart_syscall": 128, "kill": 129, "tkill": 130, "tgkill": 131, "sigaltstack": 132, "rt_sigsuspend": 133,
        "rt_sigaction": 134, "rt_sigprocmask": 135, "rt_sigpending": 136, "rt_sigtimedwait": 137,
        "rt_sigqueueinfo": 138, "rt_sigreturn": 139, "setpriority": 140, "getpriority": 141, "getresuid": 148,
        "getresgid": 150, "times": 153, "setpgid": 154, "getpgid": 155, "getsid": 156, "setsid": 157, "getgroups": 158,
        "uname": 160, "getrlimit": 163, "setrlimit": 164, "getrusage": 165, "umask": 166, "prctl": 167, "getcpu": 168,
        "gettimeofday": 169, "getpid": 172, "getppid": 173, "getuid": 174, "geteuid": 175, "getgid": 176,
        "getegid": 177, "gettid": 178, "sysinfo": 179, "socket": 198, "socketpair": 199, "bind": 200,
        "getsockname": 204, "getpeername": 205, "sendto": 206, "recvfrom": 207, "setsockopt": 208, "getsockopt": 209,
        "shutdown": 210, "sendmsg": 211, "recvmsg": 212, "readahead": 213, "brk": 214, "munmap": 215, "mremap": 216,
        "clone": 220, "mmap": 222, "fadvise64": 223, "mprotect": 226, "msync": 227, "mincore": 232, "madvise": 233,
        "get_mempolicy": 236, "rt_tgsigqueueinfo": 240, "recvmmsg": 243, "wait4": 260, "prlimit64": 261,
        "sendmmsg": 269, "sched_setattr": 274, "sched_getattr": 275, "renameat2": 276, "getrandom": 278,
        "membarrier": 283, "copy_file_range": 285, "preadv2": 286, "pwritev2": 287, "statx": 291, "rseq": 293,
    },
}
_COMMON = {
    "pidfd_send_signal": 424, "pidfd_open": 434, "clone3": 435, "close_range": 436, "openat2": 437, "faccessat2": 439,
    "epoll_pwait2": 441, "mount_setattr": 442, "landlock_create_ruleset": 444, "landlock_add_rule": 445,
    "landlock_restrict_self": 446, "futex_waitv": 449,
}
LAST_KNOWN = 450
"""The highest system call number of Linux 6.1 (set_mempolicy_home_node, on both architectures): calls added
later are unknown to the seccomp filter and fail with ENOSYS, as on an older kernel."""
# The value seccomp sees in `seccomp_data.arch` for this build's native calls.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

MACHINE = os.uname().machine
NUMBERS: dict[str, int] = {**_NUMBERS.get(MACHINE, {}), **_COMMON}

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38


def check(result: int, what: str) -> int:
    """`result` of a libc call, or OSError with errno and `what` when it is -1."""
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def syscall(name: str, *args: object) -> int:
    if name not in NUMBERS:
        raise OSError(38, f"{name}: no system call number for {MACHINE}")
    return check(libc.syscall(NUMBERS[name], *args), name)


def prctl(option: int, value: int) -> None:
    check(libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Empty every capability set of this process (also those a new user namespace grants its creator)."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set
    check(libc.capset(ctypes.byref(header), (_CapData * 2)()), "capset")

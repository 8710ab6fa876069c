"""The few Linux system calls the sandbox needs that Python 3.11's `os` lacks, through ctypes."""

from __future__ import annotations

import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# Syscall numbers differ between architectures, except for those added since Linux 5.1 (424 and up).
_NUMBERS = {
    "x86_64": {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "unshare": 272, "setns": 308,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "bpf": 321, "perf_event_open": 298,
        "keyctl": 250, "add_key": 248, "request_key": 249, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "userfaultfd": 323, "prctl": 157,
        "socket": 41, "connect": 42, "accept": 43, "listen": 50, "accept4": 288, "clone": 56, "capset": 126,
        "personality": 135, "acct": 163, "swapon": 167, "swapoff": 168, "reboot": 169,
        "memfd_create": 319, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "msgget": 68, "msgsnd": 69,
        "msgrcv": 70, "msgctl": 71, "semget": 64, "semop": 65, "semtimedop": 220, "semctl": 66, "mq_open": 240,
        "inotify_init": 253, "inotify_init1": 294, "inotify_add_watch": 254, "fanotify_init": 300,
        "fanotify_mark": 301, "modify_ldt": 154,
        "syslog": 103, "iopl": 172, "ioperm": 173, "open_by_handle_at": 304, "name_to_handle_at": 303, "kcmp": 312,
        "lookup_dcookie": 212, "quotactl": 179, "nfsservctl": 180, "vhangup": 153, "uselib": 134, "ustat": 136,
        "sysfs": 139, "_sysctl": 156, "settimeofday": 164, "clock_settime": 227, "adjtimex": 159,
        "clock_adjtime": 305, "sethostname": 170, "setdomainname": 171, "mbind": 237, "set_mempolicy": 238,
        "migrate_pages": 256, "move_pages": 279, "remap_file_pages": 216, "create_module": 174,
        "get_kernel_syms": 177, "query_module": 178, "afs_syscall": 183, "tuxcall": 184, "security": 185,
        "putpmsg": 182, "getpmsg": 181, "epoll_ctl_old": 214, "epoll_wait_old": 215, "vserver": 236,
        "uretprobe": 335,
    },
    "aarch64": {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "unshare": 97, "setns": 268,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "bpf": 280, "perf_event_open": 241,
        "keyctl": 219, "add_key": 217, "request_key": 218, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "userfaultfd": 282, "prctl": 167,
        "socket": 198, "connect": 203, "accept": 202, "listen": 201, "accept4": 242, "clone": 220, "capset": 91,
        "personality": 92, "acct": 89, "swapon": 224, "swapoff": 225, "reboot": 142,
        "memfd_create": 279, "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "msgget": 186,
        "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "semget": 190, "semop": 193, "semtimedop": 192,
        "semctl": 191, "mq_open": 180, "inotify_init1": 26, "inotify_add_watch": 27, "fanotify_init": 262,
        "fanotify_mark": 263,
        "syslog": 116, "open_by_handle_at": 265, "name_to_handle_at": 264, "kcmp": 272, "lookup_dcookie": 18,
        "quotactl": 60, "nfsservctl": 42, "vhangup": 58, "settimeofday": 170, "clock_settime": 112,
        "adjtimex": 171, "clock_adjtime": 266, "sethostname": 161, "setdomainname": 162, "mbind": 235,
        "set_mempolicy": 237, "migrate_pages": 238, "move_pages": 239, "remap_file_pages": 234,
    },
}
_COMMON = {
    "pidfd_getfd": 438, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "clone3": 435, "mount_setattr": 442, "landlock_create_ruleset": 444, "landlock_add_rule": 445,
    "landlock_restrict_self": 446, "memfd_secret": 447, "quotactl_fd": 443, "process_madvise": 440,
    "process_mrelease": 448, "set_mempolicy_home_node": 450,
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

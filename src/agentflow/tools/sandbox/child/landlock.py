"""Landlock (Linux 5.13+): a process restricts itself, and every descendant, to a set of paths and rights.

The kernel checks each open, exec, TCP bind/connect and signal against the rules; code inside cannot lift
them. We ask for every right this kernel's ABI knows, so anything not granted below is denied.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

from .linux import PR_SET_NO_NEW_PRIVS, prctl, syscall

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

# File-system rights each ABI added (ABI 1: Linux 5.13, 2: 5.19, 3: 6.2, 5: 6.10).
_FS_BY_ABI = {1: (1 << 13) - 1, 2: REFER, 3: TRUNCATE, 5: IOCTL_DEV}
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the only ones a rule on a file may hold

READ = READ_FILE | READ_DIR
# Everything but running programs and making device nodes.
WRITE = (READ | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_SYM
         | REFER | TRUNCATE)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The kernel's Landlock ABI (1 or more); OSError when Landlock is not built in or not enabled at boot."""
    return syscall("landlock_create_ruleset", None, ctypes.c_size_t(0), ctypes.c_uint32(1))


def handled_fs(abi: int) -> int:
    return sum(rights for version, rights in _FS_BY_ABI.items() if version <= abi)


def restrict_self(rules: Iterable[tuple[str, int]]) -> int:
    """Allow only `rules` ((path, rights); rights beneath a directory) from now on; returns the ABI used.

    TCP bind and connect (ABI 4+) are denied outright, and so are signals and abstract UNIX sockets towards
    processes outside this domain (ABI 6+). Sets no_new_privs, which Landlock requires of an unprivileged caller.
    """
    abi = abi_version()
    fs = handled_fs(abi)
    attr = _RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    ruleset = syscall("landlock_create_ruleset", ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                      ctypes.c_uint32(0))
    try:
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                allowed = rights & fs if os.path.isdir(path) else rights & fs & _FILE_RIGHTS
                beneath = _PathBeneathAttr(allowed, fd)
                syscall("landlock_add_rule", ruleset, 1, ctypes.byref(beneath), ctypes.c_uint32(0))
            finally:
                os.close(fd)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        syscall("landlock_restrict_self", ruleset, ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return abi

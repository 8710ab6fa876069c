"""New namespaces and a new root file system made only of what the code may read, the working directory and
a few device files; the host's file system is detached, so nothing else can even be named.

The working directory is a tmpfs of its own, limited in bytes and in files, mounted inside the run's mount
namespace: nothing the code writes reaches the host's disk, and it is gone when the namespace is.
"""

from __future__ import annotations

import ctypes
import os

from .linux import check, libc, syscall

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
MNT_DETACH = 2
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 1, 2, 4, 8
AT_RECURSIVE = 0x8000
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
HOST_NAME = b"sandbox"
# Per IPC namespace: no System V shared memory, message queues or POSIX queues (seccomp denies the calls too).
_IPC_LIMITS = {"kernel/shmmni": "0", "kernel/shmall": "0", "kernel/shmmax": "0", "kernel/msgmni": "0",
               "kernel/msgmnb": "0", "fs/mqueue/queues_max": "0"}


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def unshare(flags: int) -> None:
    check(libc.unshare(flags), "unshare")


def set_host_name() -> None:
    """A fixed host and domain name in the run's UTS namespace, instead of the copy of the host's."""
    check(libc.sethostname(HOST_NAME, len(HOST_NAME)), "sethostname")
    check(libc.setdomainname(b"(none)", 6), "setdomainname")


def limit_ipc() -> None:
    """IPC limits near zero in the run's new IPC namespace, where the kernel lets us write them (as root).

    Best effort on purpose: the seccomp filter denies every System V and POSIX queue call, so these only back
    it up; without privilege over the namespace's owner they are read-only.
    """
    for name, value in _IPC_LIMITS.items():
        try:
            with open(f"/proc/sys/{name}", "w") as handle:
                handle.write(value)
        except OSError:
            return


def map_to_self(uid: int, gid: int) -> None:
    """In a new user namespace, keep our own ids (an unprivileged user may map only itself)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)


def _encode(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(libc.mount(_encode(source), _encode(target), _encode(fstype), ctypes.c_ulong(flags), _encode(data)),
          f"mount {target}")


def _set_attributes(target: str, attributes: int, recursive: bool) -> None:
    attr = _MountAttr(attributes, 0, 0, 0)
    syscall("mount_setattr", -1, os.fsencode(target), AT_RECURSIVE if recursive else 0, ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)))


def _mount_point(root: str, path: str, is_dir: bool) -> str:
    target = root + path
    if is_dir:
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        if not os.path.exists(target):
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    return target


def build_root(root: str, read_paths: list[str], links: dict[str, str], workdir: str, work: dict[str, int],
               owner: tuple[int, int]) -> bool:
    """Make `root` (an empty directory) the new `/` of this mount namespace; True when /proc could be mounted.

    Must run as root of the mount namespace, in the new PID namespace (for /proc). `read_paths` are real
    paths, bound read-only at the same place; `links` are symbolic links to recreate (`/lib` -> `usr/lib`).
    `workdir` gets a tmpfs of `work["bytes"]` and `work["files"]` inodes, owned by `owner` (uid, gid).
    """
    old_umask = os.umask(0o022)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates back to the host
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=1024")
    for path, target in links.items():
        os.symlink(target, root + path)
    for path in read_paths:
        target = _mount_point(root, path, os.path.isdir(path))
        _mount(path, target, None, MS_BIND | MS_REC)
        _set_attributes(target, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, recursive=True)
    for device in DEVICES:
        if os.path.exists(device):
            target = _mount_point(root, device, is_dir=False)
            _mount(device, target, None, MS_BIND)
            # read-only: the devices still read and write, but their host inodes (timestamps) cannot change
            _set_attributes(target, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, recursive=False)
    target = _mount_point(root, workdir, is_dir=True)
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV,
           f"mode=0700,size={work['bytes']},nr_inodes={work['files']},uid={owner[0]},gid={owner[1]}")
    try:  # a fresh /proc of this PID namespace, its processes only: no /proc/sys, cmdline, boot_id, mounts of...
        _mount("proc", _mount_point(root, "/proc", is_dir=True), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
               "subset=pid,hidepid=invisible")
        has_proc = True
    except OSError:  # ...the host; a locked-down container may refuse it: no /proc at all then
        has_proc = False
    _set_attributes(root, MOUNT_ATTR_RDONLY, recursive=False)
    os.chdir(root)
    syscall("pivot_root", b".", b".")  # the old root ends up stacked under the new one ...
    check(libc.umount2(b".", MNT_DETACH), "umount old root")  # ... and is detached here
    os.chdir("/")
    os.umask(old_umask)
    return has_proc

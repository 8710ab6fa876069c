"""Removing a run's folder whatever the code did to it: any depth, read-only folders; never raises.

`shutil.rmtree` recurses once per level (a tree 1,500 levels deep raised RecursionError and stayed) and cannot
enter a folder the code made read-only when we are not root. Here the walk is a loop over directory file
descriptors, one open at a time, so neither depth nor path length matters.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def remove_tree(path: str) -> bool:
    """Delete `path` and everything under it; False (logged) when something stayed, never an exception."""
    try:
        _remove(path)
    except Exception as err:  # a cleanup must not lose the run's result; what stayed is logged
        log.warning("sandbox: could not remove %s: %s", path, err)
    if os.path.lexists(path):
        log.warning("sandbox: %s is still on disk after the run", path)
        return False
    return True


def _remove(path: str) -> None:
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path) or os.path.islink(path):
        os.unlink(path)
        return
    parent = os.open(os.path.dirname(os.path.abspath(path)) or "/", _DIR_FLAGS)
    names = [os.path.basename(os.path.abspath(path))]  # the path from `parent` down to the folder being emptied
    try:
        while names:
            with contextlib.suppress(OSError):  # a read-only folder can be emptied once it is ours to write
                os.chmod(names[-1], 0o700, dir_fd=parent)  # a folder (checked without following): no link here
            current = os.open(names[-1], _DIR_FLAGS, dir_fd=parent)
            child = _empty_but_one_folder(current)
            if child is None:  # empty now: remove it, then go back up to its parent
                os.close(current)
                os.rmdir(names.pop(), dir_fd=parent)
                if names:
                    above = os.open("..", _DIR_FLAGS, dir_fd=parent)
                    os.close(parent)
                    parent = above
            else:  # go down into the sub-folder, keeping one descriptor open
                os.close(parent)
                parent = current
                names.append(child)
    finally:
        os.close(parent)


def _empty_but_one_folder(fd: int) -> str | None:
    """Remove every non-folder in the folder `fd`; the name of one sub-folder left, or None when it is empty."""
    with os.scandir(fd) as entries:
        for entry in entries:
            if stat.S_ISDIR(entry.stat(follow_symlinks=False).st_mode):
                return entry.name
            os.unlink(entry.name, dir_fd=fd)
    return None

"""A cgroup per run, where the machine lets us make one: the run's memory (every process, tmpfs pages, shared
memory), its process count and its CPU time counted and bounded by the kernel as one.

cgroup v2 when our own cgroup, or its parent, hands the memory and pids controllers down to its children (the
root; the top of a delegated subtree we were started in a leaf of); otherwise cgroup v1's memory, pids and
cpuacct hierarchies (a v1/v2 hybrid, as root). Neither: None, and the limits that need no cgroup hold alone
(`docs/tools.md`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_REMOVE_TRIES = 50  # rmdir fails with EBUSY until the kernel has let go of the last process: 0.5 s at most


@dataclass
class RunCgroup:
    """The folders of one run's cgroup (one per v1 hierarchy, or a single v2 one)."""

    version: int
    folders: dict[str, str]  # controller ("memory", "pids", "cpuacct"; "" for v2) -> folder
    made: list[str] = field(default_factory=list)

    @property
    def procs_files(self) -> list[str]:
        """Where the run's first process writes its pid (so that all it forks is counted)."""
        return [os.path.join(folder, "cgroup.procs") for folder in dict.fromkeys(self.folders.values())]

    def _read(self, controller: str, name: str) -> str:
        with open(os.path.join(self.folders[controller], name)) as handle:
            return handle.read()

    def cpu_seconds(self) -> float | None:
        """CPU time of every process of the run so far, as the kernel counts it; None without accounting."""
        try:
            if self.version == 2:
                stat = dict(line.split() for line in self._read("", "cpu.stat").splitlines())
                return int(stat["usage_usec"]) / 1e6
            return int(self._read("cpuacct", "cpuacct.usage")) / 1e9
        except (KeyError, OSError, ValueError):
            return None

    def out_of_memory(self) -> bool:
        """True when the kernel's OOM killer acted in this run's cgroup (its memory limit was reached)."""
        try:
            if self.version == 2:
                events = dict(line.split() for line in self._read("", "memory.events").splitlines())
                return int(events.get("oom_kill", 0)) > 0 or int(events.get("oom", 0)) > 0
            control = dict(line.split() for line in self._read("memory", "memory.oom_control").splitlines())
            return int(control.get("oom_kill", 0)) > 0 or int(control.get("under_oom", 0)) > 0
        except (OSError, ValueError):
            return False

    def remove(self, tries: int = _REMOVE_TRIES) -> bool:
        """Remove the folders once their processes are gone, trying each up to `tries` times 10 ms apart; False
        when one stayed (logged after the last of `_REMOVE_TRIES`). Never raises."""
        left = []
        for folder in reversed(self.made):
            for attempt in range(tries):
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if attempt + 1 < tries:
                        time.sleep(0.01)
            else:
                left.append(folder)
        self.made = [folder for folder in self.made if folder in left]
        if left and tries >= _REMOVE_TRIES:
            log.warning("sandbox: cgroup %s could not be removed", ", ".join(left))
        return not left


def create(memory_bytes: int, max_processes: int) -> RunCgroup | None:
    """A new cgroup for one run, limited to `memory_bytes` (no swap) and `max_processes`; None where it cannot be
    made (not root and no delegated subtree, no memory or pids controller)."""
    name = f"agentflow-run-{uuid.uuid4().hex[:16]}"
    for make in (_create_v2, _create_v1):
        try:
            made = make(name, memory_bytes, max_processes)
        except OSError as err:
            log.debug("sandbox: no cgroup (%s): %s", make.__name__, err)
            continue
        if made is not None:
            return made
    return None


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, file system type, options) of each cgroup file system."""
    found = []
    with open("/proc/self/mounts") as handle:
        for line in handle:
            _, point, kind, options, *_ = line.split()
            if kind in ("cgroup", "cgroup2"):
                found.append((point.replace("\\040", " "), kind, set(options.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """Our cgroup in each hierarchy: controller (or "" for v2) -> path."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _write(folder: str, name: str, value: str) -> None:
    with open(os.path.join(folder, name), "w") as handle:
        handle.write(value)


def _create_v2(name: str, memory_bytes: int, max_processes: int) -> RunCgroup | None:
    own = _own_paths().get("")
    points = [point for point, kind, _ in _mounts() if kind == "cgroup2"]
    if own is None or not points:
        return None
    # A cgroup that holds processes cannot hand the memory controller down (the kernel's "no internal
    # processes" rule; only the root is exempt), so our own cgroup serves only at the root; elsewhere its parent
    # does, when we were started in a leaf of a delegated subtree whose top hands memory and pids down.
    for path in dict.fromkeys((own, os.path.dirname(own.rstrip("/")) or "/")):
        parent = os.path.join(points[0], path.lstrip("/"))
        with open(os.path.join(parent, "cgroup.subtree_control")) as handle:
            if {"memory", "pids"} <= set(handle.read().split()):
                break
    else:
        return None  # not handed down to us (no delegation, or v1 holds these controllers)
    folder = os.path.join(parent, name)
    os.mkdir(folder, 0o755)
    group = RunCgroup(2, {"": folder}, [folder])
    try:
        _write(folder, "memory.max", str(memory_bytes))
        with contextlib.suppress(FileNotFoundError):  # no swap accounting on this kernel: swap is not bounded
            _write(folder, "memory.swap.max", "0")
        _write(folder, "pids.max", str(max_processes))
    except OSError:
        group.remove()
        raise
    return group


def _create_v1(name: str, memory_bytes: int, max_processes: int) -> RunCgroup | None:
    own = _own_paths()
    points = {controller: point for point, kind, options in _mounts() if kind == "cgroup"
              for controller in ("memory", "pids", "cpuacct") if controller in options}
    if not {"memory", "pids"} <= points.keys():
        return None
    group = RunCgroup(1, {})
    try:
        for controller, point in points.items():
            folder = os.path.join(point, own.get(controller, "/").lstrip("/"), name)
            os.mkdir(folder, 0o755)
            group.folders[controller] = folder
            group.made.append(folder)
        memory = group.folders["memory"]
        _write(memory, "memory.limit_in_bytes", str(memory_bytes))
        with contextlib.suppress(FileNotFoundError):  # swap accounting off (swapaccount=0): swap is not bounded
            _write(memory, "memory.memsw.limit_in_bytes", str(memory_bytes))
        _write(group.folders["pids"], "pids.max", str(max_processes))
    except OSError:
        group.remove()
        raise
    return group

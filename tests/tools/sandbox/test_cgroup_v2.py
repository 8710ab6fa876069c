"""The cgroup v2 branch of the cgroup per run: its file protocol against a cgroup2 tree made of plain files, and
what this kind of machine lets us check on its real cgroup2 mount.

Why not the whole branch for real here: on this v1/v2 hybrid the `memory` and `pids` controllers are bound to
their v1 hierarchies (the machine's own services hold memory cgroups there), and a controller serves one
hierarchy only; the cgroup2 mount (`/sys/fs/cgroup/unified`) offers `hugetlb` alone, and mounting cgroup2
again, even in a private mount namespace, shows the same single hierarchy. Moving the controllers would mean
unmounting v1 for the whole machine. `docs/tools.md` says more.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from agentflow.tools.sandbox import cgroup


def _fake_v2(monkeypatch: pytest.MonkeyPatch, root: Path, own: str, handed_down: dict[str, str]) -> None:
    """A cgroup2 hierarchy at `root` with our process in `own`; `handed_down` holds each cgroup's
    `cgroup.subtree_control`."""
    for path in {own, *handed_down}:
        (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    for path, enabled in handed_down.items():
        (root / path.lstrip("/") / "cgroup.subtree_control").write_text(enabled + "\n")
    monkeypatch.setattr(cgroup, "_mounts", lambda: [(str(root), "cgroup2", {"rw", "nsdelegate"})])
    monkeypatch.setattr(cgroup, "_own_paths", lambda: {"": own})


def _limits(group: cgroup.RunCgroup) -> dict[str, str]:
    folder = Path(group.folders[""])
    return {name: (folder / name).read_text() for name in ("memory.max", "memory.swap.max", "pids.max")}


def test_v2_in_a_leaf_of_a_delegated_subtree(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Started in `agentflow.service/main` of a subtree delegated to us (its top hands memory and pids down, as
    it may because it holds no process): each run gets a cgroup beside ours."""
    _fake_v2(monkeypatch, tmp_path, "/agentflow.service/main",
             {"/": "memory pids", "/agentflow.service": "memory pids", "/agentflow.service/main": ""})
    group = cgroup.create(64 * 2 ** 20, 8)
    assert group is not None and group.version == 2
    folder = Path(group.folders[""])
    assert folder.parent == tmp_path / "agentflow.service" and folder.name.startswith("agentflow-run-")
    assert group.made == [str(folder)] and group.procs_files == [str(folder / "cgroup.procs")]
    assert _limits(group) == {"memory.max": str(64 * 2 ** 20), "memory.swap.max": "0", "pids.max": "8"}


def test_v2_at_the_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_v2(monkeypatch, tmp_path, "/", {"/": "cpu io memory pids"})
    group = cgroup.create(2 ** 30, 18)
    assert group is not None and group.version == 2 and Path(group.folders[""]).parent == tmp_path
    assert _limits(group) == {"memory.max": str(2 ** 30), "memory.swap.max": "0", "pids.max": "18"}


@pytest.mark.parametrize("enabled", ["", "cpu io hugetlb", "memory", "pids"])
def test_v2_without_memory_and_pids_handed_down_gives_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           enabled: str) -> None:
    """As on this machine, where v1 holds memory and pids: no v2 cgroup, and no v1 either (none mounted)."""
    _fake_v2(monkeypatch, tmp_path, "/session.scope", {"/": enabled, "/session.scope": ""})
    assert cgroup.create(2 ** 30, 18) is None
    assert [entry.name for entry in tmp_path.iterdir() if entry.is_dir()] == ["session.scope"]


def test_v2_counts_cpu_time_and_oom_kills(tmp_path: Path) -> None:
    group = cgroup.RunCgroup(2, {"": str(tmp_path)})
    assert group.cpu_seconds() is None and not group.out_of_memory()  # files not there: no count, no OOM
    (tmp_path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    assert group.cpu_seconds() == 2.5 and not group.out_of_memory()
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert group.out_of_memory()


def _own_v2_folder() -> Path | None:
    """Our own cgroup on a real cgroup2 mount, when we may make cgroups in it (root)."""
    if os.geteuid() != 0:
        return None
    points = [point for point, kind, _ in cgroup._mounts() if kind == "cgroup2"]
    own = cgroup._own_paths().get("")
    if not points or own is None:
        return None
    folder = Path(points[0]) / own.lstrip("/")
    return folder if os.access(folder, os.W_OK) else None


@pytest.mark.skipif(_own_v2_folder() is None, reason="no writable cgroup2 mount (not root, or a v1-only machine)")
def test_a_real_cgroup2_folder_counts_cpu_and_is_removed() -> None:
    """What a real cgroup2 gives without controllers: CPU time (`cpu.stat` is always there) and removal once
    the last process is gone. No `memory.events` without the memory controller: no OOM is reported."""
    parent = _own_v2_folder()
    assert parent is not None
    folder = parent / f"agentflow-test-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    group = cgroup.RunCgroup(2, {"": str(folder)}, [str(folder)])
    try:
        spin = ("import sys, time\nsys.stdin.readline()\nend = time.process_time() + 0.3\n"
                "while time.process_time() < end:\n    pass\n")
        child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE)
        Path(group.procs_files[0]).write_text(str(child.pid))
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        child.stdin.close()
        assert child.wait(timeout=30) == 0
        seconds = group.cpu_seconds()
        assert seconds is not None and 0.25 <= seconds < 5, seconds
        assert not group.out_of_memory()
    finally:
        assert group.remove() and not folder.exists()

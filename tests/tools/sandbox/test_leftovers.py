"""Finding 3: the working folder is bounded in bytes and files, nothing the code wrote is on the host after the
call whatever it did to its folder, and the call always returns a result."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentflow.tools.sandbox import cgroup, run_python_sandboxed
from tests.tools.sandbox.hostile import attempt, needs_cgroups, run_hostile
from tests.tools.sandbox.test_kernel_guarantees import SURVIVOR


def _sandbox_folders() -> set[Path]:
    return set(Path(os.environ.get("TMPDIR", "/tmp")).glob("agentflow-sandbox-*"))


async def test_the_working_folder_is_bounded_in_bytes() -> None:
    code = attempt("for i in range(100):\n    open(f'f{i}', 'wb').write(b'x' * 2 ** 20)")  # 100 MB, 1 MB files
    result = await run_hostile(code, disk_mb=16, timeout_s=20.0)
    assert "blocked OSError" in result.stdout and "No space left" in result.stdout, result.stdout + result.stderr


async def test_the_working_folder_is_bounded_in_files() -> None:
    code = attempt("for i in range(5000):\n    open(f'f{i}', 'w').close()")
    result = await run_hostile(code, max_files=500, timeout_s=20.0)
    assert "No space left" in result.stdout, result.stdout + result.stderr


DEEP = """\
import os
for _ in range(1500):
    os.mkdir('d')
    os.chdir('d')
    open('f', 'w').write('x')
print('deep', flush=True)
"""


@pytest.mark.parametrize("isolation", ["kernel", "process"])
async def test_a_deep_tree_is_removed_and_the_result_kept(isolation: str) -> None:
    before = _sandbox_folders()
    result = await run_python_sandboxed(DEEP, isolation=isolation, timeout_s=30.0,  # type: ignore[arg-type]
                                        max_files=4000)
    assert result.ok and result.stdout == "deep\n", result.stderr
    assert _sandbox_folders() <= before


async def test_read_only_folders_are_removed_too() -> None:
    before = _sandbox_folders()
    code = "import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('x')\nos.chmod('a/b', 0o500)\nos.chmod('a', 0o500)"
    result = await run_python_sandboxed(code, isolation="process")
    assert result.ok, result.stderr
    assert _sandbox_folders() <= before


async def test_nothing_reaches_the_host_disk() -> None:
    """The kernel level's folder on the host is only a mount point: the files live in the run's own tmpfs."""
    code = ("import os\nopen('marker', 'w').write('x')\n"
            "print([line.split()[4] + ' ' + line.split(' - ')[1].split()[0] for line in open('/proc/self/mountinfo')"
            " if line.split()[4] == os.getcwd()])")
    result = await run_python_sandboxed(code)
    assert result.ok, result.stderr
    assert result.stdout.strip() == "['/sandbox tmpfs']"


@needs_cgroups
async def test_the_runs_cgroup_is_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[cgroup.RunCgroup] = []

    def recording(*args: int) -> cgroup.RunCgroup | None:
        group = create(*args)
        made.extend([group] if group else [])
        return group

    create = cgroup.create
    monkeypatch.setattr(cgroup, "create", recording)
    result = await run_hostile(SURVIVOR)  # a process that outlives the code's own
    assert result.ok and made, result.stderr
    assert not any(os.path.exists(folder) for folder in made[0].folders.values())

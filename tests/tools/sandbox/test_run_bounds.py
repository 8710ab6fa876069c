"""Findings 1 and 2: one run's memory (every process, memfd, shared memory), CPU time and processes are bounded
as a whole, not per process, and the code's processes are the OOM killer's first choice."""

from __future__ import annotations

import pytest

from tests.tools.sandbox.hostile import attempt, needs_cgroups, run_hostile

MEMFD = """\
import os
kept = []
for _ in range(30):  # 10 MB each: under the file-size limit
    fd = os.memfd_create('x')
    for _ in range(10):
        os.write(fd, b'x' * 2 ** 20)
    kept.append(fd)
print('stored 300 MB', flush=True)
"""

SYSV = """\
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for _ in range(4):  # allocated, filled and detached: no address space stays in use
    shm = libc.shmget(0, 100 * 2 ** 20, 0o1000 | 0o600)
    assert shm >= 0, ctypes.get_errno()
    address = libc.shmat(shm, None, 0)
    assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    ctypes.memset(address, 1, 100 * 2 ** 20)
    libc.shmdt(ctypes.c_void_p(address))
print('stored 400 MB', flush=True)
"""


@pytest.mark.parametrize("code", [MEMFD, SYSV], ids=["memfd", "sysv shared memory"])
async def test_memory_outside_the_address_space_is_refused(code: str) -> None:
    result = await run_hostile(attempt(code), memory_mb=128, timeout_s=20.0)
    assert "stored" not in result.stdout, result.stdout
    assert "blocked" in result.stdout or result.memory_error, result.stdout + result.stderr


# Six children of 100 MB each, forked together or one after the other (as on a loaded machine). The bound is on what
# the run holds at once: the OOM killer may take a child that has already allocated and let the next one go on, so
# "six children allocated" says nothing; six alive together, each holding its 100 MB, would break the bound.
CHILDREN_ALLOCATE = """\
import os, select, time
ready, tell = os.pipe()
pids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        time.sleep(STAGGER * i)
        block = bytearray(100 * 2 ** 20)  # touched: 100 MB each, 600 MB in all
        os.write(tell, b'+')
        time.sleep(60)  # held until the parent ends it
        os._exit(0)
    pids.append(pid)
told, gone, deadline = 0, set(), time.monotonic() + 20.0
while told + len(gone) < 6 and time.monotonic() < deadline:
    if select.select([ready], [], [], 0.1)[0]:
        told += len(os.read(ready, 6))
    gone |= {pid for pid in pids if pid not in gone and os.waitpid(pid, os.WNOHANG)[0]}
print(f'{told} allocated, {len(gone)} killed', flush=True)
if told == 6 and not gone:
    print('600 MB held at once', flush=True)
for pid in set(pids) - gone:
    os.kill(pid, 9)
"""


@needs_cgroups
@pytest.mark.parametrize("stagger", [0.0, 0.5], ids=["together", "one after the other"])
async def test_memory_of_all_processes_counts_together(stagger: float) -> None:
    result = await run_hostile(CHILDREN_ALLOCATE.replace("STAGGER", str(stagger)), memory_mb=256, timeout_s=30.0)
    assert " allocated, " in result.stdout and "held at once" not in result.stdout, result.stdout + result.stderr
    assert result.memory_error


@needs_cgroups
async def test_six_children_hold_600_mb_at_once_when_the_bound_allows_it() -> None:
    """The check above can fail: with room for all six it sees them alive together."""
    result = await run_hostile(CHILDREN_ALLOCATE.replace("STAGGER", "0.0"), memory_mb=1024, timeout_s=30.0)
    assert "600 MB held at once" in result.stdout and not result.memory_error, result.stdout + result.stderr


CHILDREN_SPIN = """\
import os, time
for _ in range(6):
    if os.fork() == 0:
        end = time.process_time() + 0.9  # each stays under its own 1 s RLIMIT_CPU
        while time.process_time() < end:
            pass
        os._exit(0)
for _ in range(6):
    os.wait()
print('6 CPU-seconds spent', flush=True)
"""


@needs_cgroups
async def test_cpu_time_of_all_processes_counts_together() -> None:
    result = await run_hostile(CHILDREN_SPIN, cpu_s=1.0, timeout_s=30.0)
    assert "6 CPU-seconds spent" not in result.stdout
    assert result.cpu_limit and not result.timed_out
    assert result.cpu_seconds is not None and result.cpu_seconds < 2.0


async def test_the_code_is_the_oom_killers_first_choice() -> None:
    body = ("print('score', open('/proc/self/oom_score_adj').read().strip(), flush=True)\n"
            + attempt("open('/proc/self/oom_score_adj', 'w').write('0')"))
    result = await run_hostile(body)
    assert "score 1000" in result.stdout and "blocked" in result.stdout, result.stdout + result.stderr


@needs_cgroups
async def test_files_in_the_working_folder_count_as_memory() -> None:
    code = "for i in range(30):\n    open(f'f{i}', 'wb').write(b'x' * 10 * 2 ** 20)\nprint('stored 300 MB', flush=True)"
    result = await run_hostile(code, memory_mb=128, disk_mb=512, timeout_s=30.0)
    assert "stored" not in result.stdout and result.memory_error, result.stdout + result.stderr

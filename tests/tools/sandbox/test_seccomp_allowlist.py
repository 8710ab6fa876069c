"""The seccomp filter is an allowlist: a call off the list fails with EPERM (never a kill), the numbers are the
kernel's, and ordinary Python work (threads, forks, files, UNIX sockets, numpy, sympy) still runs."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentflow.tools.sandbox.child import linux, seccomp
from tests.tools.sandbox.hostile import run_hostile

_X86_HEADER = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
_GENERIC_HEADER = Path("/usr/include/asm-generic/unistd.h")
# What arch/arm64/include/uapi/asm/unistd.h defines before it includes the generic table.
_AARCH64_WANTS = {"__ARCH_WANT_RENAMEAT", "__ARCH_WANT_NEW_STAT", "__ARCH_WANT_SET_GET_RLIMIT",
                  "__ARCH_WANT_TIME32_SYSCALLS", "__ARCH_WANT_SYS_CLONE3", "__ARCH_WANT_MEMFD_SECRET"}


def _x86_64_numbers() -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^#define __NR_(\w+)\s+(\d+)\s*$", _X86_HEADER.read_text(), re.M)}


def _aarch64_numbers() -> dict[str, int]:
    """The generic table as a 64-bit architecture with aarch64's wants sees it (the few #if forms it uses)."""
    def holds(condition: str) -> bool:
        condition = re.sub(r"defined\s*\(\s*(\w+)\s*\)", lambda m: str(m[1] in _AARCH64_WANTS), condition)
        condition = condition.replace("__BITS_PER_LONG", "64").replace("||", " or ").replace("&&", " and ")
        condition = re.sub(r"!(?!=)", " not ", condition)
        assert re.fullmatch(r"[\sA-Za-z0-9=!()]*", condition), condition  # booleans, numbers and comparisons
        return bool(eval(condition, {"__builtins__": {}}))

    active: list[bool] = []
    values: dict[str, int | None] = {}
    for line in _GENERIC_HEADER.read_text().splitlines():
        line = line.strip()
        if line.startswith("#ifdef"):
            active.append(line.split()[1] in _AARCH64_WANTS)
        elif line.startswith("#ifndef"):
            active.append(line.split()[1] not in _AARCH64_WANTS)
        elif line.startswith("#if"):
            active.append(holds(line[3:]))
        elif line.startswith("#else"):
            active[-1] = not active[-1]
        elif line.startswith("#endif"):
            active.pop()
        elif all(active) and (m := re.match(r"#define (__NR(?:3264)?_\w+)\s+(\w+)$", line)):
            values[m[1]] = int(m[2]) if m[2].isdigit() else values.get(m[2])
    return {name[5:]: number for name, number in values.items()
            if name.startswith("__NR_") and number is not None and name not in ("__NR_syscalls",)}


def _needed() -> set[str]:
    return {*seccomp.ALLOWED, *(name for name, _ in seccomp._JUDGED), "clone3", "pivot_root", "mount_setattr",
            "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self"}


def _table(machine: str) -> dict[str, int]:
    return {**linux._NUMBERS[machine], **linux._COMMON}


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_numbers_are_the_kernels(machine: str) -> None:
    header = _X86_HEADER if machine == "x86_64" else _GENERIC_HEADER
    if not header.exists():
        pytest.skip(f"no {header} here")
    kernel = _x86_64_numbers() if machine == "x86_64" else _aarch64_numbers()
    if machine == "x86_64":  # every name spelled as the kernel does (aarch64 lacks the legacy calls)
        assert _needed() <= kernel.keys(), _needed() - kernel.keys()
    assert _table(machine) == {name: kernel[name] for name in _needed() if name in kernel}


def _run(prog: list[tuple[int, int, int, int]], nr: int, arch: int, arg0: int = 0) -> int:
    """What the classic BPF program returns for one call (the few instructions `program()` uses)."""
    data = {0: nr, 4: arch, 16: arg0}
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:
            acc = data[k]
        elif code == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


EPERM, ENOSYS, ALLOW = 0x50000 | errno.EPERM, 0x50000 | errno.ENOSYS, 0x7FFF0000


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_allows_exactly_the_list(machine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    table = _table(machine)
    monkeypatch.setattr(seccomp, "MACHINE", machine)
    monkeypatch.setattr(seccomp, "NUMBERS", table)
    prog = seccomp.program()
    arch = linux.AUDIT_ARCH[machine]
    assert len(prog) < 4096 and all(jt < 256 and jf < 256 for _, jt, jf, _ in prog)
    allowed = {table[name] for name in seccomp.ALLOWED if name in table}
    judged = {table[name] for name, _ in seccomp._JUDGED}
    for nr in range(linux.LAST_KNOWN + 1):
        if nr not in judged and nr != table["clone3"]:
            assert _run(prog, nr, arch) == (ALLOW if nr in allowed else EPERM), nr
    assert _run(prog, linux.LAST_KNOWN + 1, arch) == ENOSYS and _run(prog, table["clone3"], arch) == ENOSYS
    assert _run(prog, 0, 0x40000003) == 0x80000000  # another ABI's numbers (i386 here) end the process
    threads = 0x3D0F00  # what glibc's pthread_create passes: CLONE_VM | FS | FILES | SIGHAND | THREAD | ...
    assert _run(prog, table["clone"], arch, threads) == ALLOW
    assert _run(prog, table["clone"], arch, threads | 0x10000000) == EPERM  # CLONE_NEWUSER
    assert _run(prog, table["socket"], arch, 1) == ALLOW and _run(prog, table["socket"], arch, 2) == EPERM
    assert _run(prog, table["socketpair"], arch, 1) == ALLOW and _run(prog, table["socketpair"], arch, 16) == EPERM
    assert _run(prog, table["personality"], arch, 0xFFFFFFFF) == ALLOW
    assert _run(prog, table["personality"], arch, 0x0040000) == EPERM  # ADDR_NO_RANDOMIZE
    assert _run(prog, table["prctl"], arch, 1) == EPERM and _run(prog, table["prctl"], arch, 15) == ALLOW


# Calls a computation never needs, by number (x86_64, aarch64). The first group was allowed by the earlier
# denylist filter and works outside the sandbox; the second is the denylist's, kept off the list.
_NEWLY_DENIED = {
    "io_setup": ((206, 0), "ctypes.c_ulong(1), ctypes.byref(ctypes.c_ulong(0))"),  # the host-wide aio-max-nr
    "seccomp": ((317, 277), "2, 0, ctypes.byref(ctypes.c_uint32(0x7FFF0000))"),  # SECCOMP_GET_ACTION_AVAIL
    "syncfs": ((306, 267), "os.open('/dev/null', os.O_RDONLY)"),  # nothing to write back there
    "get_robust_list": ((274, 100), "0, ctypes.byref(ctypes.c_void_p()), ctypes.byref(ctypes.c_size_t())"),
    "ioprio_get": ((252, 31), "1, 0"),  # IOPRIO_WHO_PROCESS, self
    "setresuid": ((117, 147), "-1, -1, -1"),  # no change at all
    "mlock": ((149, 228), "page, 4096"),
}
_STILL_DENIED = {
    "add_key": ((248, 217), "b'user', b'agentflow', b'x', 1, -3"),  # KEY_SPEC_SESSION_KEYRING
    "keyctl": ((250, 219), "0, -3, 0"),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "io_uring_setup": ((425, 425), "1, ctypes.byref((ctypes.c_char * 120)())"),
    "userfaultfd": ((323, 282), "0"),
    "perf_event_open": ((298, 241), "ctypes.byref((ctypes.c_char * 128)()), 0, -1, -1, 0"),
    "ptrace": ((101, 117), "0, 0, 0, 0"),  # PTRACE_TRACEME
    "memfd_create": ((319, 279), "b'x', 0"),
    "shmget": ((29, 194), "0, 4096, 0o1600"),
    "unshare": ((272, 97), "0x10000000"),  # CLONE_NEWUSER
}


def _probe(calls: dict[str, tuple[tuple[int, int], str]]) -> str:
    """Code that makes each call and prints `name result errno-name`."""
    index = 0 if os.uname().machine == "x86_64" else 1
    lines = ["import ctypes, errno, os", "libc = ctypes.CDLL(None, use_errno=True)",
             "libc.syscall.restype = ctypes.c_long", "page = ctypes.create_string_buffer(8192)"]
    for name, (numbers, args) in calls.items():
        lines += [f"ctypes.set_errno(0)\nresult = libc.syscall({numbers[index]}, {args})",
                  f"print({name!r}, result, errno.errorcode.get(ctypes.get_errno(), 0), flush=True)"]
    return "\n".join(lines) + "\n"


needs_known_machine = pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"),
                                         reason="probe numbers for x86_64 and aarch64 only")


@needs_known_machine
async def test_calls_off_the_list_fail_with_eperm() -> None:
    outside = subprocess.run([sys.executable, "-c", _probe(_NEWLY_DENIED)], capture_output=True, text=True,
                             timeout=30)
    for line in outside.stdout.splitlines():  # the calls work outside: only the sandbox stands in the way
        assert int(line.split()[1]) >= 0, outside.stdout
    result = await run_hostile(_probe(_NEWLY_DENIED | _STILL_DENIED)
                               + "import os\ntry:\n    os.execv('/bin/sh', ['sh'])\nexcept OSError as err:\n"
                               "    print('execve -1', errno.errorcode[err.errno])\nprint('still running')\n")
    assert result.ok and result.stdout.endswith("still running\n"), result.stdout + result.stderr
    lines = result.stdout.splitlines()[1:-1]
    assert len(lines) == len(_NEWLY_DENIED) + len(_STILL_DENIED) + 1, result.stdout
    for line in lines:
        assert line.split()[1:] == ["-1", "EPERM"], line


async def test_the_personality_can_be_read_not_changed() -> None:
    code = ("import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print('read', libc.personality(0xFFFFFFFF))\n"
            "print('change', libc.personality(0x0040000), errno.errorcode[ctypes.get_errno()])\n")
    result = await run_hostile(code)
    assert "read 0\n" in result.stdout and "change -1 EPERM" in result.stdout, result.stdout + result.stderr


ORDINARY = """\
import asyncio, concurrent.futures, mmap, multiprocessing, os, pathlib, resource, select, shutil, signal, socket
import sqlite3, tarfile, time, zipfile
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    print('threads', sum(pool.map(sum, [range(1000)] * 8)))
pid = os.fork()
if pid == 0:
    os._exit(3)
print('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
parent, child = multiprocessing.get_context('fork').Pipe()
process = multiprocessing.get_context('fork').Process(target=child.send, args=('sent',))
process.start()
print('multiprocessing', parent.recv(), process.join() or process.exitcode)
a, b = socket.socketpair()
a.sendall(b'ping')
server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
server.bind('socket')
socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'pong', 'socket')
print('sockets', b.recv(4), server.recv(4))
path = pathlib.Path('data.txt')
path.write_text('x' * 10000)
shutil.copy2(path, 'copy.txt')
os.rename('copy.txt', 'moved.txt')
os.symlink('moved.txt', 'link')
os.link('moved.txt', 'hard')
os.chmod(path, 0o600)
os.utime(path)
os.truncate(path, 5)
os.mkfifo('fifo')
with open(path, 'r+b') as handle:
    mapped = mmap.mmap(handle.fileno(), 0)
    mapped[:1] = b'y'
    mapped.close()
    os.fsync(handle.fileno())
with zipfile.ZipFile('a.zip', 'w') as archive:
    archive.write(path)
with tarfile.open('a.tgz', 'w:gz') as archive:
    archive.add(path)
db = sqlite3.connect('db.sqlite')
db.execute('create table t(x)')
db.executemany('insert into t values (?)', [(i,) for i in range(100)])
db.commit()
print('files', path.read_text(), os.statvfs('.').f_bsize > 0, db.execute('select sum(x) from t').fetchone())
alarms = []
signal.signal(signal.SIGALRM, lambda *_: alarms.append(1))
signal.setitimer(signal.ITIMER_REAL, 0.01)
time.sleep(0.1)
r, w = os.pipe()
os.write(w, b'x')
poller = select.epoll()
poller.register(r)
print('events', alarms, len(poller.poll(1)), len(select.select([r], [], [], 1)[0]))
async def main():
    await asyncio.sleep(0.01)
    return await asyncio.gather(*(asyncio.to_thread(sum, range(10)) for _ in range(3)))
print('asyncio', asyncio.run(main()), len(os.sched_getaffinity(0)) > 0, os.urandom(4) != os.urandom(4),
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0)
"""


async def test_ordinary_work_still_runs() -> None:
    result = await run_hostile(ORDINARY, timeout_s=30.0)
    assert result.ok, result.stdout + result.stderr
    for expected in ("threads 3996000", "fork 3", "multiprocessing sent 0", "sockets b'ping' b'pong'",
                     "files yxxxx True (4950,)", "events [1] 1 1", "asyncio [45, 45, 45] True True True"):
        assert expected in result.stdout, result.stdout


async def test_numpy_and_sympy_still_run() -> None:
    pytest.importorskip("numpy")
    pytest.importorskip("sympy")
    code = ("import numpy as np, sympy\nrng = np.random.default_rng(0)\nm = rng.random((200, 200))\n"
            "print('numpy', bool(np.linalg.det(m @ m.T + np.eye(200)) > 0), np.fft.fft(np.ones(8))[0].real)\n"
            "x = sympy.symbols('x')\nprint('sympy', sympy.integrate(sympy.sin(x) ** 2, (x, 0, sympy.pi)))\n")
    result = await run_hostile(code, memory_mb=1024, timeout_s=60.0)
    assert "numpy True 8.0" in result.stdout and "sympy pi/2" in result.stdout, result.stdout + result.stderr

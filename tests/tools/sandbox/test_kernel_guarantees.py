"""Each guarantee of the kernel isolation level, against a program that first switches the audit hook off.

Whatever the code does in its own interpreter, the kernel must stop it. Targets are made writable, readable or
signalable by the sandbox's user where the test can, so that only the sandbox stands in the way.
`test_the_same_attacks_succeed_at_the_process_level` shows that these programs do break a hook-only sandbox.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentflow
from agentflow.tools.sandbox.policy import unprivileged_identity
from tests.tools.sandbox.hostile import (
    CGROUPS,
    attempt,
    pid_namespace_of,
    processes_in,
    run_hostile,
    session_members,
)

AS_ROOT = os.geteuid() == 0
SANDBOX_UID = unprivileged_identity()[0] if AS_ROOT else os.getuid()


@pytest.fixture
def open_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder in /tmp that everyone may write to, holding a file everyone may write to."""
    folder = Path(f"/tmp/agentflow-open-{uuid.uuid4().hex}")
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    victim = folder / "victim.txt"
    victim.write_text("original")
    victim.chmod(0o666)
    yield folder
    shutil.rmtree(folder)


def _targets(open_dir: Path) -> dict[str, Path]:
    name = f"agentflow-escape-{uuid.uuid4().hex}"
    return {
        "tmp": open_dir / name,
        "home": Path.home() / name,
        "agentflow package": Path(agentflow.__file__).parent / f"{name}.py",
        "site-packages": Path(sysconfig.get_paths()["purelib"]) / f"{name}.py",
    }


WRITES = {
    "open": "open({target!r}, 'w').write('x')",
    "os.open": "import os\nos.write(os.open({target!r}, os.O_WRONLY | os.O_CREAT, 0o644), b'x')",
    "rename": "open('inside', 'w').write('x')\nimport os\nos.rename('inside', {target!r})",
    "symlink": "import os\nos.symlink({target!r}, 'link')\nopen('link', 'w').write('x')",
    "ctypes creat": "import ctypes\nassert ctypes.CDLL(None).creat({target!r}.encode(), 0o644) >= 0",
}


@pytest.mark.parametrize("where", ["tmp", "home", "agentflow package", "site-packages"])
@pytest.mark.parametrize("how", list(WRITES))
async def test_no_writes_outside_the_working_directory(open_dir: Path, where: str, how: str) -> None:
    target = _targets(open_dir)[where]
    result = await run_hostile(attempt(WRITES[how].format(target=str(target))))
    assert "escaped" not in result.stdout, result.stdout
    assert "blocked" in result.stdout
    assert not target.exists() and not target.is_symlink()


async def test_existing_files_outside_stay_unchanged(open_dir: Path) -> None:
    victim = open_dir / "victim.txt"
    body = "".join(attempt(action) for action in (
        f"open({str(victim)!r}, 'a').write('changed')",
        f"import os\nos.truncate({str(victim)!r}, 0)",
        f"import os\nos.remove({str(victim)!r})",
        f"import os\nos.chmod({str(victim)!r}, 0o777)",
    ))
    result = await run_hostile(body)
    assert result.stdout.count("blocked") == 4, result.stdout
    assert victim.read_text() == "original" and victim.stat().st_mode & 0o777 == 0o666


async def test_writes_to_dev_null_and_inside_work() -> None:
    result = await run_hostile("open('/dev/null', 'w').write('x')\nimport os\nos.mkdir('d')\n"
                               "open('d/f', 'w').write('ok')\nos.rename('d/f', 'g')\nprint(open('g').read())")
    assert result.ok, result.stderr
    assert result.stdout.endswith("ok\n")


EXECS = {
    "shell": "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo shell ran'])",
    "python": "import os, sys\nos.execv(sys.executable, [sys.executable, '-c', 'print(1)'])",
    "subprocess": "import subprocess\nprint(subprocess.run(['/bin/echo', 'ran'], capture_output=True).stdout)",
    "os.system": "import os\nassert os.system('echo shell ran > marker') == 0\nassert os.path.exists('marker')",
    "copied binary": "import os, shutil\nshutil.copy('/bin/echo', 'mine')\nos.chmod('mine', 0o755)\n"
                     "os.execv('./mine', ['mine', 'ran'])",
    "ctypes execve": "import ctypes\nlibc = ctypes.CDLL(None)\n"
                     "argv = (ctypes.c_char_p * 2)(b'/bin/sh', None)\nassert libc.execve(b'/bin/sh', argv, None) == 0",
}


@pytest.mark.parametrize("how", list(EXECS))
async def test_no_program_can_be_started(how: str) -> None:
    result = await run_hostile(attempt(EXECS[how]))
    assert "escaped" not in result.stdout and "ran" not in result.stdout.replace("hook off", "")
    assert "blocked" in result.stdout, result.stdout + result.stderr


class _Listeners:
    """A TCP server, a UDP socket and an abstract UNIX socket on this host, counting what reaches them."""

    def __init__(self) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.abstract = f"\0agentflow-test-{uuid.uuid4().hex}"
        self.unix.bind(self.abstract)
        self.unix.listen()
        self.received: list[object] = []
        self.stop = threading.Event()
        for each in (self.tcp, self.udp, self.unix):
            each.settimeout(0.1)
        self.threads = [threading.Thread(target=self._serve, args=(s,), daemon=True)
                        for s in (self.tcp, self.udp, self.unix)]
        for thread in self.threads:
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        while not self.stop.is_set():
            try:
                self.received.append(sock.recvfrom(100) if sock.type == socket.SOCK_DGRAM else sock.accept())
            except (TimeoutError, OSError):
                continue

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=2)
        for each in (self.tcp, self.udp, self.unix):
            each.close()


async def test_no_network_not_even_the_hosts_loopback() -> None:
    listeners = _Listeners()
    tcp, udp = listeners.tcp.getsockname()[1], listeners.udp.getsockname()[1]
    try:
        body = "".join(attempt(action) for action in (
            f"import socket\nsocket.create_connection(('127.0.0.1', {tcp}), timeout=2)",
            f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"s.sendto(b'x', ('127.0.0.1', {udp}))",
            f"import socket\nsocket.create_connection(('::1', {tcp}), timeout=2)",
            f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({listeners.abstract!r})",
            "import socket\nsocket.socket(socket.AF_NETLINK, socket.SOCK_RAW)",
            f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{tcp}/', timeout=2)",
        ))
        result = await run_hostile(body, timeout_s=20.0)
        await asyncio.sleep(0.3)
        assert result.stdout.count("blocked") == 6, result.stdout + result.stderr
        assert listeners.received == []
    finally:
        listeners.close()


@pytest.fixture
def neighbour() -> Iterator[subprocess.Popen]:
    """A process on this host run by the sandbox's own user, with a secret in its environment."""
    secret = f"neighbour-secret-{uuid.uuid4().hex}"
    proc = subprocess.Popen(["sleep", "120"], env={"NEIGHBOUR_SECRET": secret},
                            user=SANDBOX_UID if AS_ROOT else None)
    proc.secret = secret  # type: ignore[attr-defined]
    yield proc
    proc.kill()
    proc.wait()


async def test_no_signals_or_tracing_of_processes_outside(neighbour: subprocess.Popen) -> None:
    body = "".join(attempt(action) for pid in (os.getpid(), neighbour.pid) for action in (
        f"import os, signal\nos.kill({pid}, signal.SIGKILL)",
        f"import ctypes, ctypes.util\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"assert libc.ptrace(16, {pid}, None, None) == 0, ctypes.get_errno()",
        f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"buf = ctypes.create_string_buffer(8)\niov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)\n"
        f"assert libc.process_vm_readv({pid}, iov, 1, iov, 1, 0) >= 0, ctypes.get_errno()",
    ))
    # Is any process at all in reach of a signal? (Probed with signal 0: a real one, had it escaped, would hit
    # every process of this user on the machine.) Then the namespace's init: the run must go on undisturbed.
    body += attempt("import os\nos.kill(-1, 0)")
    body += attempt("import os, signal\nos.kill(1, signal.SIGKILL)") + "print('still running')\n"
    result = await run_hostile(body)
    assert result.stdout.count("blocked") == 8, result.stdout + result.stderr
    assert result.stdout.endswith("still running\n") and result.ok
    assert neighbour.poll() is None


async def test_no_proc_secrets_of_processes_outside(neighbour: subprocess.Popen,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    mine = f"parent-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("AGENTFLOW_PARENT_SECRET", mine)
    body = (f"import os\nfor pid, names in (({os.getpid()}, 'environ cmdline maps mem'), "
            f"({neighbour.pid}, 'environ cmdline maps mem'), (1, 'environ maps mem')):\n"
            "    for name in names.split():\n"
            "        try:\n            print(open(f'/proc/{pid}/{name}', 'rb').read(4000))\n"
            "        except OSError as err:\n            print('blocked', pid, name, err)\n"
            "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n")
    result = await run_hostile(body)
    assert result.ok, result.stderr
    assert mine not in result.stdout and neighbour.secret not in result.stdout  # type: ignore[attr-defined]
    assert result.stdout.count("blocked") == 11, result.stdout  # init (pid 1) is ours, but hidden (hidepid)
    assert result.stdout.rstrip().endswith("['2']")  # only the code itself is visible


SURVIVOR = """\
import os, signal, time
namespace = os.readlink('/proc/self/ns/pid')
leader = os.fork()
if leader == 0:
    os.setsid()
    if os.fork() == 0:
        for number in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(number, signal.SIG_IGN)
        for fd in (0, 1, 2):
            os.close(fd)
        open('started', 'w').close()
        time.sleep(120)
    os._exit(0)
while not os.path.exists('started'):
    time.sleep(0.01)
print('survivor started in', namespace, 'session', leader, flush=True)
"""


async def test_nothing_survives_the_call() -> None:
    result = await run_hostile(SURVIVOR)
    assert result.ok and "survivor started" in result.stdout, result.stdout + result.stderr
    namespace = result.stdout.split("survivor started in ")[1].split()[0]
    assert namespace != pid_namespace_of(os.getpid())
    assert processes_in(namespace) == []


async def test_the_timeout_kills_everything() -> None:
    result = await run_hostile(SURVIVOR + "while True:\n    pass\n", timeout_s=8.0)
    assert result.timed_out and "survivor started" in result.stdout
    namespace = result.stdout.split("survivor started in ")[1].split()[0]
    assert processes_in(namespace) == []


async def test_cancellation_kills_everything() -> None:
    pids: list[int] = []
    # the run's own time limit stays far beyond the waits below: it must not end the program before the test
    # cancels it (with 60 s it did, on a loaded machine that took long to start the sandbox)
    task = asyncio.create_task(run_hostile(SURVIVOR + "while True:\n    pass\n", timeout_s=600.0,
                                           on_start=pids.append))
    namespace = None
    # the outer process makes the namespace shortly after it starts, then the program forks its survivor; the
    # limits are for a sandbox that never starts (on a loaded 2-core machine it once took more than 6 s); a
    # namespace that cannot be read yet is no answer, only the run's end stops the wait early
    ours = pid_namespace_of(os.getpid())
    for _ in range(3000):
        await asyncio.sleep(0.02)
        if task.done():
            break
        if pids and (found := pid_namespace_of(pids[0], children=True)) not in (None, ours):
            namespace = found
            break
    for _ in range(300):
        if namespace is None or len(processes_in(namespace)) > 2:
            break
        await asyncio.sleep(0.1)
    if task.done():  # the run ended on its own, before the test cancelled it: say how
        pytest.fail(f"the sandboxed run ended before it was cancelled: {task.exception() or task.result()!r}")
    assert namespace is not None and processes_in(namespace), "the sandbox never started"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert processes_in(namespace) == []


async def test_runs_unprivileged() -> None:
    body = ("import os\nprint('ids', os.getuid(), os.geteuid(), os.getgid(), os.getgroups())\n"
            "status = dict(line.split(':\\t') for line in open('/proc/self/status').read().splitlines()"
            " if ':\\t' in line)\n"
            "print('caps', status['CapEff'], status['CapPrm'], status['NoNewPrivs'], status['Seccomp'])\n"
            + attempt("import os\nos.setuid(0)") + attempt("import os\nos.chown('.', 0, 0)"))
    result = await run_hostile(body)
    assert result.ok, result.stderr
    ids = result.stdout.split("ids ")[1].split("\n")[0]
    expected_gid = unprivileged_identity()[1] if AS_ROOT else os.getgid()
    assert ids.startswith(f"{SANDBOX_UID} {SANDBOX_UID} {expected_gid}") and SANDBOX_UID != 0
    assert "caps 0000000000000000 0000000000000000 1 2" in result.stdout
    assert result.stdout.count("blocked") == 2


SECRET_TEXT = "api-key-that-must-not-leak"


@pytest.fixture
def secrets_outside() -> Iterator[tuple[Path, Path]]:
    """A secret in the home directory, and one in a folder anyone may read."""
    token = uuid.uuid4().hex
    in_home = Path.home() / f".agentflow-test-{token}"
    in_home.write_text(f"home-{SECRET_TEXT}")
    open_folder = Path(f"/tmp/agentflow-readable-{token}")
    open_folder.mkdir(mode=0o755)
    readable = open_folder / "readable.txt"
    readable.write_text(f"readable-{SECRET_TEXT}")
    readable.chmod(0o644)
    yield in_home, readable
    in_home.unlink()
    readable.unlink()
    open_folder.rmdir()


async def test_home_and_unlisted_folders_are_unreadable(secrets_outside: tuple[Path, Path]) -> None:
    in_home, readable = secrets_outside
    body = "".join(attempt(f"print(open({str(path)!r}).read())") for path in secrets_outside)
    body += "".join(attempt(f"import os\nprint(os.listdir({folder!r}))")
                    for folder in (str(Path.home()), "/tmp", "/", "/etc", "/home", "/run"))
    result = await run_hostile(body)
    assert SECRET_TEXT not in result.stdout, result.stdout
    assert result.stdout.count("blocked") == 8, result.stdout


async def test_read_paths_opens_a_folder_read_only(secrets_outside: tuple[Path, Path]) -> None:
    _, readable = secrets_outside
    body = attempt(f"print(open({str(readable)!r}).read())")
    body += attempt(f"open({str(readable.parent / 'new')!r}, 'w')")
    result = await run_hostile(body, read_paths=[str(readable.parent)])
    assert f"readable-{SECRET_TEXT}" in result.stdout and result.stdout.count("blocked") == 1, result.stdout
    assert not (readable.parent / "new").exists()


def _raise_then(limit: str, value: str, then: str) -> str:
    """Code that tries to lift a limit (it must be refused), then does what the limit forbids."""
    return (f"import resource\ntry:\n    resource.setrlimit(resource.{limit}, ({value}, {value}))\n"
            f"    print('lifted', flush=True)\nexcept (ValueError, OSError) as err:\n"
            f"    print('refused', err, flush=True)\n{then}")


# With a cgroup per run the memory bound is the cgroup's (no /sys inside to change it), else the address space.
_MEMORY = (("import os\ntry:\n    os.listdir('/sys/fs/cgroup')\n    print('lifted', flush=True)\n"
            "except OSError as err:\n    print('refused', err, flush=True)\nx = bytearray(2 * 1024 ** 3)")
           if CGROUPS else _raise_then("RLIMIT_AS", "-1", "x = bytearray(2 * 1024 ** 3)"))
LIMITS = {
    "memory": (_MEMORY, {"memory_mb": 256}, lambda r: r.memory_error if CGROUPS else "MemoryError" in r.stderr),
    "cpu": (_raise_then("RLIMIT_CPU", "-1", "while True:\n    pass"), {"cpu_s": 1.0, "timeout_s": 20.0},
            lambda r: r.cpu_limit),
    "file size": (_raise_then("RLIMIT_FSIZE", "-1", "open('big', 'wb').write(b'x' * 3 * 1024 ** 2)"),
                  {"max_file_mb": 1}, lambda r: "File too large" in r.stderr),
    "open files": (_raise_then("RLIMIT_NOFILE", "4096", "files = [open('/dev/null') for _ in range(200)]"), {},
                   lambda r: "Too many open files" in r.stderr),
    "processes": (_raise_then("RLIMIT_NPROC", "-1", "import os\nfor _ in range(100):\n    if os.fork() == 0:\n"
                              "        import time\n        time.sleep(5)\n        os._exit(0)"),
                  {"max_processes": 8}, lambda r: "Resource temporarily unavailable" in r.stderr),
}


@pytest.mark.parametrize("limit", list(LIMITS))
async def test_limits_cannot_be_lifted(limit: str) -> None:
    code, settings, hit = LIMITS[limit]
    result = await run_hostile(code, **settings)
    assert "refused" in result.stdout and "lifted" not in result.stdout, result.stdout
    assert hit(result), result.stderr
    assert not result.timed_out


async def test_output_limit_holds_for_raw_writes() -> None:
    result = await run_hostile("import os\nfor _ in range(200):\n    os.write(1, b'x' * 1_000_000)",
                               max_output_chars=2000)
    assert result.ok and result.stdout_dropped_bytes > 199_000_000 and len(result.stdout) < 2200


async def test_the_same_attacks_succeed_at_the_process_level(open_dir: Path) -> None:
    """The hook-off programs are real: where only the hook stands, they write outside and leave a survivor."""
    target = open_dir / f"escaped-{uuid.uuid4().hex}"
    result = await run_hostile(attempt(f"open({str(target)!r}, 'w').write('x')") + SURVIVOR, isolation="process")
    session = int(result.stdout.split(" session ")[1].split()[0]) if " session " in result.stdout else 0
    leftovers = session_members(session) if session else []
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    assert "escaped" in result.stdout and target.exists(), result.stdout + result.stderr
    assert leftovers, "the survivor should outlive a hook-only sandbox"

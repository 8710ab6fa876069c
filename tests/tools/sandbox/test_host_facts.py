"""Finding 7: the code learns nothing of the host from /proc, its host name or watches on the bound folders,
and cannot change the host's device files."""

from __future__ import annotations

import os
import socket

from tests.tools.sandbox.hostile import attempt, run_hostile


async def test_proc_shows_only_the_runs_own_processes() -> None:
    body = "".join(attempt(f"print(open({path!r}).read()[:200])") for path in (
        "/proc/cmdline", "/proc/sys/kernel/random/boot_id", "/proc/1/status", "/proc/mounts", "/proc/version"))
    body += ("import os\nprint('self', os.getpid(), open('/proc/self/cmdline', 'rb').read())\n"
             "print('mounts', open('/proc/self/mountinfo').read())\n")
    result = await run_hostile(body)
    assert result.ok, result.stderr
    assert result.stdout.count("blocked") == 5, result.stdout
    assert "agentflow-sandbox-" not in result.stdout  # the host's temporary folder of the run
    assert str(os.getpid()) not in result.stdout.split("self ", 1)[1].split("\n")[0].split(" ", 1)[1]


async def test_the_host_name_is_fixed() -> None:
    result = await run_hostile("import socket\nprint('name', socket.gethostname())")
    assert result.stdout.strip().endswith("name sandbox") and socket.gethostname() != "sandbox"


async def test_no_watches_on_host_activity() -> None:
    body = "".join(attempt(f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nassert {call} >= 0") for call in (
        "libc.inotify_init1(0)", "libc.inotify_init()", "libc.fanotify_init(0, 0)"))
    result = await run_hostile(body)
    assert result.stdout.count("blocked") == 3, result.stdout


async def test_device_files_of_the_host_stay_unchanged() -> None:
    before = os.stat("/dev/null").st_mtime_ns
    # Setting the time to now needs only write access, which everyone has to /dev/null.
    body = attempt("import os\nos.utime('/dev/null')") + attempt("import os\nos.chmod('/dev/null', 0o600)")
    body += "open('/dev/null', 'w').write('still writable')\nprint('written')\n"
    result = await run_hostile(body)
    assert result.stdout.count("blocked") == 2 and "written" in result.stdout, result.stdout + result.stderr
    assert os.stat("/dev/null").st_mtime_ns == before


async def test_no_x86_segment_descriptors() -> None:
    body = attempt("import ctypes\nassert ctypes.CDLL(None, use_errno=True).syscall(154, 0, None, 0) >= 0")
    result = await run_hostile(body)
    assert os.uname().machine != "x86_64" or "blocked" in result.stdout, result.stdout


async def test_the_filter_allows_only_calls_it_knows() -> None:
    """A call newer than the filter's table (cachestat, fchmodat2, mseal) fails as on an older kernel; calls that
    reveal the host or act on it (kernel log, file handles, the clock) are denied."""
    body = ("import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "for number in (451, 452, 462):\n"
            "    print('call', number, libc.syscall(number, 0, 0, 0), errno.errorcode[ctypes.get_errno()])\n")
    body += attempt("import ctypes\nassert ctypes.CDLL(None).klogctl(10, None, 0) >= 0")  # size of the log
    body += attempt("import ctypes\nhandle = ctypes.create_string_buffer(136)\nhandle[0] = 128\n"
                    "mount = ctypes.c_int()\n"
                    "assert ctypes.CDLL(None).name_to_handle_at(-100, b'/', handle, ctypes.byref(mount), 0) == 0")
    result = await run_hostile(body)
    for number in (451, 452, 462):
        assert f"call {number} -1 ENOSYS" in result.stdout, result.stdout + result.stderr
    assert result.stdout.count("blocked") == 2, result.stdout

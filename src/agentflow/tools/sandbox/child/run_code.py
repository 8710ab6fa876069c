"""The last step before the user's code: the audit hook (clear errors for careless code), then the code itself.

The hook is not a boundary: plain Python can switch it off. At the kernel level it only turns the most common
denials into a readable `PermissionError: sandbox: ...`; the kernel's rules are what hold.
"""

from __future__ import annotations

import _posixsubprocess
import builtins
import os
import sys

_BLOCKED = frozenset({
    "os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp", "os.spawn", "os.exec", "os.system",
    "os.startfile", "subprocess.Popen", "pty.spawn", "os.chroot", "os.mknod", "os.mkfifo",
    "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata",
    "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr", "socket.getnameinfo",
    "socket.sethostname", "urllib.Request", "http.client.connect", "ftplib.connect", "smtplib.connect",
    "poplib.connect", "imaplib.open", "nntplib.connect", "telnetlib.Telnet.open", "webbrowser.open",
})
_PATH_EVENTS = {  # event -> indices of path arguments that must stay inside the working directory
    "os.rename": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.symlink": (1,),
    "os.link": (0, 1), "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
    "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,), "os.chflags": (0,),
}
_HERE = os.path.dirname(os.path.abspath(__file__))


def install_hook(root: str) -> None:
    """Build the audit hook over closure state (not module globals), then install it for good."""
    pid = str(os.getpid())
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    allowed_writes = ("/dev/null",)
    realpath, fsdecode, sep, modules, blocked, path_events = (
        os.path.realpath, os.fsdecode, os.sep, sys.modules, _BLOCKED, dict(_PATH_EVENTS))

    def deny(what):
        raise PermissionError(f"sandbox: {what} is not allowed")

    def inside(path):
        if isinstance(path, int):
            return True
        full = realpath(fsdecode(path))
        return full == root or full.startswith(root + sep) or full in allowed_writes

    def other_proc(path):
        if isinstance(path, int):
            return False
        parts = realpath(fsdecode(path)).split(sep)
        return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != pid

    def hook(event, args):
        if event in blocked or event.startswith(("os.exec", "os.spawn", "os.posix_spawn")):
            deny(event)
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            if path is None:
                return
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags > 0 and flags & write_flags)
            if writing and not inside(path):
                deny(f"writing {fsdecode(path)!r} (outside the working directory)")
            if other_proc(path):
                deny(f"reading {fsdecode(path)!r}")
        elif event in path_events:
            for index in path_events[event]:
                if index < len(args) and args[index] is not None and not inside(args[index]):
                    deny(f"{event} on {fsdecode(args[index])!r} (outside the working directory)")
        elif event == "socket.__new__":
            if len(args) > 1 and args[1] not in (-1, 1):  # AF_UNIX (1) socketpairs back asyncio's self-pipe
                deny("opening a network socket")
        elif event in ("os.kill", "os.killpg"):
            if event == "os.killpg" or args[0] not in (0, int(pid)):
                deny(f"{event} (signalling another process)")
        elif event == "import" and args[0] == "_posixsubprocess" and args[0] not in modules:
            deny("importing _posixsubprocess again")

    def denied_fork_exec(*args, **kwargs):
        deny("subprocess creation")

    # subprocess calls this C function after its own audit event; a direct call raises no event of its own.
    _posixsubprocess.fork_exec = denied_fork_exec
    sys.addaudithook(hook)


def _ours(filename: str) -> bool:
    return filename.startswith(_HERE + os.sep) or filename == "<string>"


def run(source: str, workdir: str, names: dict) -> None:
    """Install the hook, then run `source` as `__main__` with `names` bound; a traceback shows the user's frames
    only. Exits."""
    sys.dont_write_bytecode = True
    for name in [n for n in sys.modules if n == "child" or n.startswith("child.")]:
        del sys.modules[name]  # `import child` in the user's code must not find us
    install_hook(os.path.realpath(workdir))
    main = type(sys)("__main__")
    main.__dict__["__builtins__"] = builtins
    main.__dict__.update(names)
    sys.modules["__main__"] = main
    try:
        compiled = compile(source, "<code>", "exec")
    except (SyntaxError, ValueError) as err:
        import traceback  # here, not at the top: with linecache it costs ~20 ms of CPU at every start

        sys.stderr.write("".join(traceback.format_exception_only(type(err), err)))
        sys.exit(1)
    try:
        exec(compiled, main.__dict__)
    except SystemExit:
        raise
    except BaseException as err:
        import linecache
        import traceback

        linecache.cache["<code>"] = (len(source), None, source.splitlines(True), "<code>")
        report = traceback.TracebackException(type(err), err, err.__traceback__)
        for each in (report, *(e for e in (report.__cause__, report.__context__) if e is not None)):
            each.stack = traceback.StackSummary.from_list([f for f in each.stack if not _ours(f.filename)])
        sys.stderr.write("".join(report.format()))
        sys.exit(1)
    sys.exit(0)

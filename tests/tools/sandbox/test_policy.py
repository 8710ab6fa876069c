"""The read policy: the interpreter's own folders and the system libraries, never the home directory."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from agentflow.tools.sandbox.policy import interpreter_paths, read_policy


def _covered(path: str, paths: tuple[str, ...]) -> bool:
    real = os.path.realpath(path)
    return any(real == p or real.startswith(p.rstrip("/") + "/") for p in paths)


def test_default_covers_the_interpreter_and_its_packages() -> None:
    policy = read_policy(sys.executable)
    for path in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], os.path.dirname(os.__file__)):
        assert _covered(path, policy.paths), path
    import numpy

    assert _covered(numpy.__file__, policy.paths)
    assert _covered("/etc/ld.so.cache", policy.paths) or not os.path.exists("/etc/ld.so.cache")


def test_default_keeps_home_tmp_and_credentials_out() -> None:
    policy = read_policy(sys.executable)
    home = str(Path.home())
    for secret in (home, os.path.join(home, ".ssh"), "/tmp", "/etc/shadow", "/run", "/var", "/proc", "/sys"):
        assert not _covered(secret, policy.paths), secret
    # The interpreter may live under the home directory (pyenv, a venv in a clone); only its folders are in.
    assert not any(home.startswith(p.rstrip("/") + "/") or home == p for p in policy.paths)


def test_paths_are_real_and_none_is_inside_another(tmp_path: Path) -> None:
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    (tmp_path / "link").symlink_to(inner)
    policy = read_policy(sys.executable, [str(tmp_path / "a"), str(inner), str(tmp_path / "link"),
                                          str(tmp_path / "missing")])
    assert str(tmp_path / "a") in policy.paths
    assert str(inner) not in policy.paths and str(tmp_path / "link") not in policy.paths
    assert all(p == os.path.realpath(p) for p in policy.paths)
    for p in policy.paths:
        assert not any(p.startswith(q + "/") for q in policy.paths if q != p and q != "/")


def test_top_level_links_are_recreated_not_bound() -> None:
    policy = read_policy(sys.executable)
    for name in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(name):
            assert policy.links[name] == os.readlink(name)
            assert name not in policy.paths


def test_interpreter_paths_are_asked_of_the_interpreter_in_isolated_mode(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/definitely/not/there")
    interpreter_paths.cache_clear()
    assert "/definitely/not/there" not in interpreter_paths(sys.executable)

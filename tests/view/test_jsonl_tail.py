"""Following an append-only JSONL file: only complete lines, and a fresh start when the file is replaced."""

from __future__ import annotations

import os
from pathlib import Path

from agentflow.view.jsonl_tail import JsonlTail


def test_reads_only_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == []                      # not written yet
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3')  # the third line is being written
    assert tail.read_new() == [(1, {"a": 1}), (2, {"a": 2})]
    assert tail.read_new() == []
    with path.open("ab") as handle:
        handle.write(b'}\nnot json\n[1]\n{"a": 4}\n')
    assert tail.read_new() == [(3, {"a": 3}), (6, {"a": 4})]  # a bad line and a non-object are skipped
    assert not tail.reset


def test_starts_over_when_the_file_shrinks_or_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n')
    tail = JsonlTail(path)
    assert len(tail.read_new()) == 2
    path.write_text('{"b": 1}\n')                      # truncated and rewritten
    assert tail.read_new() == [(1, {"b": 1})] and tail.reset
    replacement = tmp_path / "new.jsonl"
    replacement.write_text('{"c": 1}\n{"c": 2}\n{"c": 3}\n')
    os.replace(replacement, path)                       # a new inode, longer than before
    assert [r for _, r in tail.read_new()] == [{"c": 1}, {"c": 2}, {"c": 3}] and tail.reset

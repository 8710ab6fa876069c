"""Follow an append-only JSONL file: each call reads only the complete lines written since the last one."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class JsonlTail:
    """Reads new complete lines of a file that a writer appends to (results.jsonl, metrics.jsonl).

    A line without its newline is being written and is left for the next call. If the file shrinks or is
    replaced (a new inode), everything is read again and `reset` is set, so callers start over.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.line_number = 0
        self._inode: int | None = None
        self.reset = False

    def read_new_lines(self) -> list[tuple[int, bytes]]:
        """(line number, bytes) of each complete, non-blank line written since the last call."""
        self.reset = False
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return []
        if self._inode is not None and (stat.st_ino != self._inode or stat.st_size < self.offset):
            self.offset, self.line_number, self.reset = 0, 0, True
        self._inode = stat.st_ino
        if stat.st_size == self.offset:
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read(stat.st_size - self.offset)
        end = chunk.rfind(b"\n")
        if end == -1:
            return []
        self.offset += end + 1
        lines = []
        for line in chunk[:end].split(b"\n"):
            self.line_number += 1
            if line.strip():
                lines.append((self.line_number, line))
        return lines

    def read_new(self) -> list[tuple[int, dict[str, Any]]]:
        """(line number, object) of each complete line written since the last call; bad lines are skipped."""
        records = []
        for number, line in self.read_new_lines():
            try:
                record = json.loads(line)
            except ValueError as err:
                log.warning("%s:%d: skipping an unreadable line: %s", self.path, number, err)
                continue
            if isinstance(record, dict):
                records.append((number, record))
        return records

"""Consoles and log output that show text from tools, models and files without letting it drive the terminal.

Rich escapes its markup but passes control sequences through: a tool result holding OSC 52 would set the user's
clipboard, a cursor-up plus erase would hide the line above. `SafeConsole` makes every character of text it
renders visible (`textsafe.terminal_safe`); only Rich's own styles and cursor controls reach the terminal.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

from agentflow.textsafe import terminal_safe


class SafeConsole(Console):
    """A rich Console whose rendered text never holds a control character or bidi control of its own."""

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            # Control segments are Rich's own (cursor moves of a live display); text is what we were given.
            yield segment if segment.control else Segment(terminal_safe(segment.text), segment.style)


class SafeFormatter(logging.Formatter):
    """A log formatter for terminals: messages (which may quote a model or a tool) made inert."""

    def format(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().format(record))

"""What a client can put into the server's log: its text escaped and capped, its lines limited per session.

A client's frames, event types, ids and values reach log lines through error messages and notes. :func:`quote`
is how any of them is shown (escaped as ``repr`` does, so no NUL, control character or line break reaches the
log, and cut at :data:`QUOTE_CHARS`); a :class:`ClientLog` is how a session writes the lines its client causes:
at most :data:`LINES_PER_MINUTE` a minute, the rest counted and told once when the session ends.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

QUOTE_CHARS = 120  # the most of a client's text a log line shows, escaped
LINES_PER_MINUTE = 20  # log lines one session's client may cause each minute; the rest are only counted


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``value`` as a log may show it: quoted, escaped like ``repr``, at most ``limit`` characters of it.

    What is cut off is said by its size: ``'AAAA…'…(10240 bytes)``.
    """
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
    shown, size = [], 0
    for char in text:
        piece = repr(char)[1:-1]  # escaped alone: \x00, \n, \u202e; a quote stays itself
        if size + len(piece) > limit:
            whole = len(value) if isinstance(value, bytes) else len(text.encode("utf-8", "surrogatepass"))
            return f"'{''.join(shown)}…'…({whole} bytes)"
        shown.append(piece)
        size += len(piece)
    return f"'{''.join(shown)}'"


class ClientLog:
    """The log lines one session's client causes, each prefixed with the session's id, at most a few a minute.

    Args:
        session_id: named in every line.
        logger: where the lines go.
        per_minute: lines let through in each minute; the others are counted.
        clock: seconds (monotonic).
    """

    def __init__(self, session_id: str, logger: logging.Logger, per_minute: int = LINES_PER_MINUTE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.session_id, self.logger, self.per_minute, self.clock = session_id, logger, per_minute, clock
        self._window_start = clock()
        self._in_window = 0
        self.suppressed = 0

    def line(self, level: int, message: str, *args: Any, exc_info: bool = False) -> None:
        """Log ``session <id>: message % args`` unless this minute's lines are spent (then count it).

        Client text in ``args`` must come through :func:`quote`.
        """
        now = self.clock()
        if now - self._window_start >= 60:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self.per_minute:
            self.suppressed += 1
            return
        self._in_window += 1
        self.logger.log(level, "session %s: " + message, self.session_id, *args, exc_info=exc_info)

    def finish(self) -> None:
        """At the session's end: how many lines were left out, if any."""
        if self.suppressed:
            self.logger.warning("session %s: %d more log line(s) suppressed (over %d a minute from its client)",
                                self.session_id, self.suppressed, self.per_minute)

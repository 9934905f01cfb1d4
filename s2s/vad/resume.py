"""The turn that just ended, kept a short while in case the speaker goes on: a pause judged done that was not.

No detector tells every mid-sentence pause from an end (a half such as "Go forward" is a sentence itself), so
some turns end too soon and the reply starts inside the pause. When the speaker goes on within ``window`` of the
turn's end (when its reply could start), the VAD opens the new utterance on the ended one's audio, the gap included: the new turn holds
the whole sentence and names the turn it resumes (``SpeechSegment.resumes``). Barge-in drops that turn's reply, and
the LLM answers the whole instead (the history forgets the half: :meth:`s2s.chat_context.ChatContext.discard`).

The window holds on the input's clock and on the wall clock both: a client that sends no audio while its user is
silent (the Agents SDK sends what it is given, at once) stops the input's clock, and speech 2 s later would
otherwise come right after the turn.
"""
from __future__ import annotations

import time

import numpy as np


class Resumable:
    """The last ended utterance's frames, and every frame after them while the window lasts.

    Args:
        window: samples from the turn's end during which new speech continues it (0: never).
        rate: the samples' rate (the window's length in wall time).
    """

    def __init__(self, window: int, rate: int) -> None:
        self.window, self.rate = window, rate
        self.forget()

    def forget(self) -> None:
        self.frames: list[np.ndarray] = []
        self.turn: int | None = None  # the turn the frames were answered as (None: nothing to resume)
        self.start = 0  # where the utterance began, in samples of the input
        self._quiet = 0  # samples since the turn ended
        self._ended = 0.0  # ... and when, on the wall clock

    def keep(self, frames: list[np.ndarray], turn: int, start: int) -> None:
        """Utterance ``turn`` (``frames``, from sample ``start`` of the input up to now) ended."""
        if self.window:
            self.frames, self.turn, self.start, self._quiet = list(frames), turn, start, 0
            self._ended = time.monotonic()

    def add(self, frame: np.ndarray) -> None:
        """A frame with no utterance open: the gap grows, until it is past the window."""
        if self.turn is None:
            return
        self._quiet += len(frame)
        if self._quiet > self.window:
            self.forget()
            return
        self.frames.append(frame)

    def take(self) -> tuple[list[np.ndarray], int, int] | None:
        """Speech began again: (the frames so far, the turn they resume, their start), once; None past the window."""
        if self.turn is None or time.monotonic() - self._ended > self.window / self.rate:
            self.forget()
            return None
        taken = (self.frames, self.turn, self.start)
        self.forget()
        return taken

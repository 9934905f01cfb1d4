"""Pauses inside an utterance: a long one is shortened, and a turn that ended in one may be resumed.

**Shortened.** Whisper hears a sentence with a long pause in it worse than the same sentence said in one go, so the
VAD keeps at most ``gap`` of the silence Silero hears between two words (:func:`shorten_pause`; Silero's silence
starts after its hangover and ends before it hears the next word, so the quiet that is kept is longer). On the turn
bench's real recordings with a 0.7-1.2 s pause spliced in, each heard as one utterance, tiny.en's WER went from
0.179 to 0.135 on the 11 held-out recordings and from 0.111 to 0.108 on the first 12; their complete versions were
heard the same.

**Resumed.** No detector tells every mid-sentence pause from an end (a half such as "Go forward" is a sentence
itself), so some turns end too soon and the reply starts inside the pause. When the speaker goes on within
``window`` of the turn's end (when its reply could start), the VAD opens the new utterance on the ended one's audio:
the new turn holds the whole sentence and names the turn it resumes (``SpeechSegment.resumes``). Barge-in drops that
turn's reply, and the LLM answers the whole instead (the history forgets the half:
:meth:`s2s.chat_context.ChatContext.discard`). The window holds on the input's clock and on the wall clock both: a
client that sends no audio while its user is silent (the Agents SDK sends what it is given, at once) stops the
input's clock, and speech 2 s later would otherwise come right after the turn.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np


def shorten_pause(frames: list[np.ndarray], silent: int, head: int, tail: int) -> tuple[list[np.ndarray], int]:
    """``frames`` whose last frame broke a run of ``silent`` silent frames before it, with that run cut to its first
    ``head`` and last ``tail`` frames (a new list; the frames themselves are never written), and how many frames went.
    """
    if silent <= head + tail:
        return frames, 0
    end = len(frames) - 1
    first, last = end - silent + head, end - tail
    return frames[:first] + frames[last:], last - first


@dataclass
class Resumed:
    """What goes on from an ended turn: its frames and the gap's, the turn, where it began (samples of the input),
    the silent frames at its end (the pause so far) and the frames its pauses lost (:func:`shorten_pause`)."""

    frames: list[np.ndarray]
    turn: int
    start: int
    silent: int
    shortened: int


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
        self.kept: Resumed | None = None  # the turn that may go on (None: nothing to resume)
        self._quiet = 0  # samples since the turn ended
        self._ended = 0.0  # ... and when, on the wall clock

    def keep(self, ended: Resumed) -> None:
        """An utterance ended (its frames up to now)."""
        if self.window:  # its own list of the frames: the gap's are appended to it
            self.kept, self._quiet, self._ended = replace(ended, frames=list(ended.frames)), 0, time.monotonic()

    def add(self, frame: np.ndarray) -> None:
        """A frame with no utterance open: the gap grows, until it is past the window."""
        if self.kept is None:
            return
        self._quiet += len(frame)
        if self._quiet > self.window:
            self.forget()
            return
        self.kept.frames.append(frame)
        self.kept.silent += 1

    def take(self) -> Resumed | None:
        """Speech began again: what it goes on from, once; None past the window."""
        kept = self.kept if time.monotonic() - self._ended <= self.window / self.rate else None
        self.forget()
        return kept

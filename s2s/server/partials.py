"""Partial transcripts: the open utterance transcribed again while the user speaks, off the audio path.

The session's VAD (:class:`~s2s.server.stages.SessionVAD`) offers the utterance so far after each input chunk;
:class:`PartialTranscriber` runs one pass at a time in a worker thread with the session pipeline's STT stage
(the VAD and graph threads never wait for it; the stage runs one pass at a time, its own turn's included) and hands the text back through a callback that may still drop
it (the turn moved on while the pass ran). The Realtime API's deltas are appended text, so
:func:`new_suffix` decides what a pass, and the final transcript, add to what the client already has.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np

from s2s import audio
from s2s.stt.base import STTStage

log = logging.getLogger("s2s.server")

OPEN_END = " .,;:!?\u2026"  # an interim pass ends where the audio does: closing punctuation there is a guess
JOIN_S = 5.0  # closing a session waits this long for a pass still running (the STT goes back to the pool)


def new_suffix(sent: str, text: str) -> str | None:
    """What ``text`` adds to ``sent`` (the deltas so far): its rest after ``sent``, or None when it revises it.

    ``sent`` must be a prefix of ``text`` ignoring case, spaces and punctuation (Whisper moves commas about as
    an utterance grows); the suffix keeps ``text``'s own spacing and punctuation (``"Hello"``, ``"hello, world"``
    -> ``", world"``), and is empty when ``text`` adds nothing.
    """
    at = 0
    matched = False
    for char in sent:
        if not char.isalnum():
            continue
        while at < len(text) and not text[at].isalnum():
            at += 1
        if at == len(text) or text[at].lower() != char.lower():
            return None
        at, matched = at + 1, True
    return text[at:] if matched else text


def interim(text: str) -> str:
    """What an interim pass's text may show: without its last word, which the audio may cut in the middle
    (Whisper guesses a word from half of it), nor the closing punctuation Whisper puts where the audio stops."""
    words = text.split()
    return text[:text.rstrip().rfind(words[-1])].rstrip(OPEN_END) if len(words) > 1 else ""


class PartialTranscriber:
    """At most one interim pass at a time, each in its own worker thread.

    Args:
        stt: the session pipeline's STT stage (``transcribe(samples)`` at its ``sample_rate``).
        every_s: seconds of new speech between two passes over the same utterance.
        deliver: called in the worker with ``(turn, text)``; it decides whether the text still goes out.
    """

    def __init__(self, stt: STTStage, every_s: float, deliver: Callable[[int, str], None],
                 sample_rate: int = 16000) -> None:
        self.stt, self.deliver, self.sample_rate = stt, deliver, sample_rate
        self.every = max(1, int(every_s * sample_rate))
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._turn: int | None = None
        self._done = 0  # samples of the open utterance the last pass started with

    def due(self, turn: int, length: int) -> bool:
        """Whether ``length`` samples of ``turn`` call for a pass now (and none is running)."""
        with self._lock:
            if self._turn != turn:
                self._turn, self._done = turn, 0
            return length - self._done >= self.every and not (self._worker and self._worker.is_alive())

    def start(self, turn: int, samples: np.ndarray, language: str | None = None) -> None:
        """Transcribe ``samples`` (the utterance so far, at ``sample_rate``; in ``language``, None: the STT's
        own) in a worker thread."""
        with self._lock:
            if self._worker is not None and self._worker.is_alive():
                return
            self._turn, self._done = turn, len(samples)
            self._worker = threading.Thread(target=self._pass, args=(turn, samples, language), daemon=True,
                                            name=f"s2s-partial-{turn}")
            self._worker.start()

    def _pass(self, turn: int, samples: np.ndarray, language: str | None) -> None:
        try:
            text, _ = self.stt.recognise(audio.resample(samples, self.sample_rate, self.stt.sample_rate), language)
        except Exception as error:  # an interim pass failing costs nothing but that delta
            log.warning("turn %d: partial transcript failed: %s: %s", turn, type(error).__name__, error)
            return
        if text := interim(text.strip()):
            self.deliver(turn, text)

    def close(self) -> None:
        """Wait (a little) for a pass still running, so the pooled STT is not lent on while it works."""
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.join(JOIN_S)

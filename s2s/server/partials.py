"""Partial transcripts: the open utterance transcribed again while the user speaks, off the audio path.

The session's VAD (:class:`~s2s.server.stages.SessionVAD`) offers the utterance so far after each input chunk;
:class:`PartialTranscriber` runs one pass at a time in a worker thread with the session pipeline's STT stage
(the VAD and graph threads never wait for it; the stage runs one pass at a time, its own turn's included) and
hands the text back through a callback that may still drop it (the turn moved on while the pass ran).

The passes are the STT's own incremental passes (:meth:`STTStage.advance` over an
:class:`~s2s.stt.incremental.Utterance`, which the session keeps for its open turn): progressive, as the reference
system's live transcription is. The words consecutive passes agree on are committed and never taken back (a
backend that can be made to start with them, faster-whisper, then decodes only what follows them); what is shown
is those words and the last pass's guesses less its last word; the passes come less often as the utterance grows
and as they cost more. The Realtime API's deltas are appended text, so :func:`new_suffix` decides what a pass, and
the final transcript, add to what the client already has.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np

from s2s import audio, turn_order
from s2s.stt.base import STTStage
from s2s.stt.incremental import Utterance

log = logging.getLogger("s2s.server")

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


class PartialTranscriber:
    """At most one interim pass at a time, each in its own worker thread, over the open turn's utterance.

    Args:
        stt: the session pipeline's STT stage.
        every_s: seconds of new speech between two passes over the same utterance (more as it grows or as
            passes cost more: :meth:`Utterance.due`).
        deliver: called in the worker with ``(turn, text)``; it decides whether the text still goes out.
    """

    def __init__(self, stt: STTStage, every_s: float, deliver: Callable[[int, str], None],
                 sample_rate: int = 16000) -> None:
        self.stt, self.deliver, self.sample_rate, self.every_s = stt, deliver, sample_rate, every_s
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._turn: int | None = None
        self._utterance: Utterance | None = None  # the open turn's committed words (None: no pass yet)

    def due(self, turn: int, length: int) -> bool:
        """Whether ``length`` samples of ``turn`` call for a pass now (and none is running)."""
        with self._lock:
            if self._turn != turn:
                self._turn, self._utterance = turn, None
            if self._worker and self._worker.is_alive():
                return False
            if self._utterance is None:
                return length >= self.every_s * self.sample_rate
            return self._utterance.due(length * self.stt.sample_rate // self.sample_rate, self.every_s,
                                       self.stt.sample_rate)

    def start(self, turn: int, samples: np.ndarray, language: str | None = None) -> None:
        """Transcribe ``samples`` (the utterance so far, at ``sample_rate``; in ``language``, None: the STT's
        own) in a worker thread."""
        samples = audio.resample(samples, self.sample_rate, self.stt.sample_rate)
        with self._lock:
            if self._worker is not None and self._worker.is_alive():
                return
            if self._turn != turn or self._utterance is None:
                self._turn, self._utterance = turn, Utterance(float(turn), samples)
            utterance = self._utterance
            self._worker = threading.Thread(target=self._pass, args=(turn, utterance, samples, language),
                                            daemon=True, name=f"s2s-partial-{turn}")
            self._worker.start()

    def _pass(self, turn: int, utterance: Utterance, samples: np.ndarray, language: str | None) -> None:
        try:
            with turn_order.slot(turn_order.ahead(), self.stt.on_cores):  # behind every turn's reply
                sure = self.stt.advance(utterance, samples, language, whole=True)
        except Exception as error:  # an interim pass failing costs nothing but that delta
            log.warning("turn %d: partial transcript failed: %s: %s", turn, type(error).__name__, error)
            utterance.heard = len(samples)  # the next pass waits as after any other
            return
        if sure and (text := utterance.shown()):
            self.deliver(turn, text)

    def close(self) -> None:
        """Wait (a little) for a pass still running, so the pooled STT is not lent on while it works."""
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.join(JOIN_S)

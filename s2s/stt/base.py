"""Shared behaviour of STT stages: one hook per utterance, resampling and the no-words rule written once.

A backend whose decoder can be made to start with given words also writes
``transcribe_from``: with ``incremental_s`` set, the stage then decodes the utterance while the user speaks
(:mod:`s2s.stt.incremental`) and the end of speech costs only the tail. Other backends keep the whole-utterance pass.
With ``at_pause`` a stage decodes the utterance once when the speech pauses, before the turn's segment goes: the
segment holds the same audio, so its transcript is then usually made (or being made) when the turn starts.
:meth:`STTStage.advance` is the one pass over an open utterance, for the stage's own incremental decoding and for
the realtime server's partial transcripts alike.
"""
from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from s2s import audio
from s2s.messages import (Data, Message, Metric, SentenceEnd, SpeechSegment, SpeechSoFar, Transcript,
                          TranscriptSoFar, TurnEnd)
from s2s.stage import Stage
from s2s.stt.incremental import Utterance
from s2s.text import has_words

log = logging.getLogger(__name__)
LOOPING = 2.4  # Whisper's compression_ratio_threshold: text that zlib shrinks more than this repeats itself


def repeats_itself(text: str) -> bool:
    """A decode that loops: its text (UTF-8) compresses by more than ``LOOPING`` (Whisper's rule)."""
    data = text.strip().encode()
    return bool(data) and len(data) / len(zlib.compress(data)) > LOOPING


class TranscriptionFailed(RuntimeError):
    """The backend could not transcribe this utterance (a server answered an error, timed out).

    The turn is dropped with the error logged; the session goes on.
    """


class STTStage(Stage):
    """Base of STT backends: implement ``transcribe(samples)`` returning ``(text, language)``.

    ``samples`` is one utterance as 1-D float32 mono at ``sample_rate`` (16 kHz, what every Whisper-family and
    Parakeet model expects), already resampled by ``process``. ``language`` is a code (``en``) or None when
    unknown. ``process`` yields a :class:`Transcript`, or, when the utterance has no words, a :class:`TurnEnd`
    that closes the turn without a reply (so a half-duplex microphone listens again). A backend raises
    :class:`TranscriptionFailed` to drop one turn with an error instead of stopping the run; ``process`` then
    records an ``stt_error`` event for the turn.

    A backend reads its ``language`` (a code; None: detected, where it can detect) when it transcribes: a
    segment that names its own (a realtime session's transcription language) is transcribed in that one.
    """

    accepts = (SpeechSegment, SpeechSoFar)
    emits = (Transcript, SentenceEnd)
    sample_rate: int = 16000
    # seconds of new speech between two passes over the open utterance; None: one pass at the end (the default)
    incremental_s: float | None = None
    at_pause: bool = False  # a pass over the utterance when the speech pauses (the VAD's paused SpeechSoFar)
    _utterance: Utterance | None = None  # the open utterance's committed words (per utterance, never longer)
    language: str | None = None  # backends set their configured one

    @property
    def asks(self) -> tuple[type[Data], ...]:  # type: ignore[override]
        return (SpeechSoFar,) if self.passes else ()

    @property
    def passes(self) -> bool:
        """Passes over the open utterance (``incremental_s`` or ``at_pause``): the segment's transcript may be made."""
        return bool(self.incremental_s or self.at_pause)

    @property
    def decodes_while_speaking(self) -> bool:
        """Passes over the utterance while the user speaks (``incremental_s``): they are its partial words."""
        return bool(self.incremental_s)

    def transcribe(self, samples: Any) -> tuple[str, str | None]:
        raise NotImplementedError

    def sentence_end(self, samples: Any, text: str) -> float | None:
        """How likely ``text`` (this stage's transcript of ``samples``) ends a sentence, as the model hears it with
        the audio; None: the backend cannot say (the words' verdict then stands alone)."""
        return None

    def transcribe_from(self, samples: Any, prefix: str) -> tuple[str | None, str | None]:
        """Incremental backends: the text of ``samples`` (the utterance so far) after ``prefix`` (its committed
        words, which the decoder is made to start with), and the language. After a prefix the text starts with a
        space unless its first piece ends the prefix's last word (a comma). None instead of the text: a decode
        the backend does not trust (it would retry it)."""
        raise NotImplementedError

    def recognise(self, samples: Any, language: str | None = None) -> tuple[str, str | None]:
        """``transcribe`` one call at a time per stage: the turn's own pass and the server's partial passes
        share a pooled stage from two threads, and no backend library (MLX least of all) is safe for that.
        ``language``: the speaker's (None: the stage's own)."""
        with self._one_at_a_time(language):
            return self.transcribe(samples)

    @property
    def forces_prefix(self) -> bool:
        """The backend writes ``transcribe_from``: a pass decodes only what follows the committed words."""
        return type(self).transcribe_from is not STTStage.transcribe_from

    def advance(self, utterance: Utterance, samples: Any, language: str | None = None, whole: bool = False) -> bool:
        """One pass over ``samples`` (the open utterance so far, at ``sample_rate``) that commits in ``utterance``
        the words it and the passes before it agree on; one call at a time per stage, as :meth:`recognise`.
        False: the backend was not sure of this pass, and nothing was committed. ``whole``: such a pass is done
        again over the whole utterance (a partial transcript has no end-of-turn retry to wait for). Raises
        :class:`TranscriptionFailed` as ``transcribe`` does."""
        started = time.perf_counter()
        forced = self.forces_prefix
        try:
            with self._one_at_a_time(language):
                rest, heard_in = self.transcribe_from(samples, utterance.prefix) if forced else (None, None)
                if not forced or (rest is None and whole):
                    (rest, heard_in), forced = self.transcribe(samples), False
        finally:
            utterance.cost_s = time.perf_counter() - started
        if rest is None:  # an unsure pass commits nothing; the next one may be sure
            utterance.unsure = len(samples)
            return False
        if forced:
            utterance.update(rest, len(samples))
        else:
            utterance.update_whole(rest, len(samples))
        utterance.language = heard_in
        return True

    @contextmanager
    def _one_at_a_time(self, language: str | None = None) -> Iterator[None]:
        """Hold the stage for one call, in ``language`` when given (the configured one comes back after it)."""
        with self.__dict__.setdefault("_stt_lock", threading.Lock()):
            configured = self.language
            if language is not None:
                self.language = language
            try:
                yield
            finally:
                self.language = configured

    def warm_up(self) -> None:
        self.recognise(audio.silence(1.0, self.sample_rate))

    def process(self, message: Data) -> Iterator[Message]:
        if isinstance(message, SpeechSoFar):
            yield from self._listen(message)
            return
        assert isinstance(message, SpeechSegment)
        samples = audio.resample(message.samples, message.sample_rate, self.sample_rate)
        try:
            if self.passes:
                text, language = self._finish(message.start_s, samples, message.language)
            else:
                text, language = self.recognise(samples, message.language)
        except TranscriptionFailed as error:
            log.error("turn %d: %s", message.turn, error)
            yield Metric(message.turn, "stt_error", 1.0, {"event": "stt_error", "error": str(error)})
            yield TurnEnd(message.turn)
            return
        if has_words(text):
            yield Transcript(text, message.turn, language, speculative=message.speculative,
                             resumes=message.resumes)
            # after the words went on (turn.sentence_end): the VAD weighs the words' verdict, which comes later, with it
            heard = self.sentence_end(samples, text) if message.speculative and SentenceEnd in self.wanted else None
            if heard is not None:
                yield SentenceEnd(message.turn, heard)
        else:
            log.info("turn %d: no words recognised, no reply", message.turn)
            yield TurnEnd(message.turn)

    # ------------------------------------------------------------------ incremental decoding
    def _listen(self, message: SpeechSoFar) -> Iterator[Message]:
        """A pass over the utterance so far when ``incremental_s`` of new speech came since the last, or (also with
        ``at_pause`` alone) the speech paused: it commits the words it and the last passes agree on, and tells what
        it heard (``incremental_s``: those are the partial words)."""
        if not self.incremental_s and not (self.at_pause and message.paused):
            return  # before the samples are joined: at_pause alone hears every 128 ms of speech for one pause
        samples = audio.resample(message.samples, message.sample_rate, self.sample_rate)
        utterance = self._utterance
        # at_pause alone: each pause's pass stands alone, so no words are ever committed and forced on the decoder
        # (with incremental_s=0.5 a forced prefix lost the last words of 2 of 12 real sentences in one run)
        if utterance is None or not utterance.holds(message.start_s, samples) or not self.incremental_s:
            utterance = self._utterance = Utterance(message.start_s, samples)
        due = message.paused or utterance.due(len(samples), self.incremental_s, self.sample_rate, cost=0.0)
        if len(samples) == utterance.heard or not due:
            return
        try:
            if not self.advance(utterance, samples, message.language):
                return
        except TranscriptionFailed as error:  # a pass failing costs only what it would have committed
            log.warning("turn %d: incremental pass failed: %s", message.turn, error)
            return
        if self.decodes_while_speaking and TranscriptSoFar in self.wanted and (text := utterance.shown()):
            yield TranscriptSoFar(message.turn, text)

    def _finish(self, key: float, samples: Any, language: str | None) -> tuple[str, str | None]:
        """The segment's transcript: the committed words and what follows them (nothing to decode if the last pass
        heard exactly this audio). A segment of another utterance starts afresh; a pass the backend does not
        trust is done again over the whole utterance, as without incremental decoding."""
        utterance = self._utterance
        if utterance is None or not utterance.holds(key, samples) or len(samples) < utterance.heard:
            utterance = self._utterance = Utterance(key, samples)
        if utterance.heard == len(samples) and has_words(heard := utterance.text()):
            return heard, utterance.language
        if utterance.unsure == len(samples) or not self.forces_prefix:  # unsure of this very audio: retry at once
            return self.recognise(samples, language)
        with self._one_at_a_time(language):
            rest, heard_in = self.transcribe_from(samples, utterance.prefix)
            if rest is None:
                return self.transcribe(samples)
        return utterance.text(rest), heard_in

    def reset(self) -> None:
        self._utterance = None

"""Shared behaviour of STT stages: one hook per utterance, resampling and the no-words rule written once."""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from s2s import audio
from s2s.messages import Data, Message, SpeechSegment, Transcript, TurnEnd
from s2s.stage import Stage

log = logging.getLogger(__name__)


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
    :class:`TranscriptionFailed` to drop one turn with an error instead of stopping the run.
    """

    accepts = (SpeechSegment,)
    emits = (Transcript,)
    sample_rate: int = 16000

    def transcribe(self, samples: Any) -> tuple[str, str | None]:
        raise NotImplementedError

    def recognise(self, samples: Any) -> tuple[str, str | None]:
        """``transcribe`` one call at a time per stage: the turn's own pass and the server's partial passes
        share a pooled stage from two threads, and no backend library (MLX least of all) is safe for that."""
        with self.__dict__.setdefault("_one_at_a_time", threading.Lock()):
            return self.transcribe(samples)

    def warm_up(self) -> None:
        self.recognise(audio.silence(1.0, self.sample_rate))

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, SpeechSegment)
        samples = audio.resample(message.samples, message.sample_rate, self.sample_rate)
        try:
            text, language = self.recognise(samples)
        except TranscriptionFailed as error:
            log.error("turn %d: %s", message.turn, error)
            yield TurnEnd(message.turn)
            return
        if text:
            yield Transcript(text, message.turn, language, speculative=message.speculative)
        else:
            log.info("turn %d: no words recognised, no reply", message.turn)
            yield TurnEnd(message.turn)

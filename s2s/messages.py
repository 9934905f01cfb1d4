"""Typed messages that flow between stages.

Data messages carry content for one user turn; control messages steer the graph. The two have separate roots
so the runner (and a reader) can tell them apart at a glance. Every audio message carries its sample rate.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Message:
    """Root of everything that travels on an edge of the graph."""


@dataclass(frozen=True)
class Data(Message):
    """Content produced by a stage."""


@dataclass(frozen=True)
class Control(Message):
    """Steers the graph; the runner forwards it downstream, stages never receive it in ``process``."""


@dataclass(frozen=True, eq=False)
class AudioChunk(Data):
    """A short block of input audio: float32 mono samples in [-1, 1]."""

    samples: np.ndarray
    sample_rate: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


@dataclass(frozen=True, eq=False)
class SpeechSegment(Data):
    """One user utterance found by the VAD; ``turn`` numbers utterances from 0."""

    samples: np.ndarray
    sample_rate: int
    turn: int
    start_s: float  # position in the input stream
    end_s: float
    speech_end_s: float | None = None  # end of the last voiced frame, on the input clock (end_s adds padding)
    closed_s: float | None = None  # input position when the VAD let the segment go (endpointing included)
    speculative: bool = False  # let go after a short silence: a TurnConfirmed or TurnDiscarded follows
    language: str | None = None  # the language its speaker set (a realtime session's); None: the STT's own
    resumes: int | None = None  # the ended turn whose speech it goes on from (and holds): the whole is answered

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


@dataclass(frozen=True, eq=False)
class Progress(Data):
    """Work in progress on an open turn, made only for a next stage that ``asks`` for it.

    A newer message holds all of an older one: the runner skips one that has anything waiting behind it, so a
    stage that fell behind starts on the latest (or on the turn's segment) instead of working through a backlog.
    """


@dataclass(frozen=True, eq=False)
class SpeechSoFar(Progress):
    """The open utterance so far, while the user speaks: the STT decodes it as it grows (incremental decoding).

    ``start_s`` names the utterance on the input clock: its :class:`SpeechSegment` starts there too, and so does
    the turn it goes on as when a speculative turn of it is discarded. ``frames`` are the VAD's own blocks
    (never written), so a message costs no copy of the audio.
    """

    frames: tuple[np.ndarray, ...]
    sample_rate: int
    turn: int
    start_s: float
    paused: bool = False  # a pause began: as long as the segment will be if it lasts (silence for what is to come)
    language: str | None = None  # as the segment's

    @property
    def samples(self) -> np.ndarray:
        return np.concatenate(self.frames) if self.frames else np.zeros(0, np.float32)

    @property
    def duration_s(self) -> float:
        return sum(len(frame) for frame in self.frames) / self.sample_rate


@dataclass(frozen=True)
class TranscriptSoFar(Control):
    """What the STT has heard of open turn ``turn`` so far (its words that stopped changing, and a guess at the
    rest); a run shows it nowhere, the realtime server sends it as transcript deltas."""

    turn: int
    text: str


@dataclass(frozen=True)
class Transcript(Data):
    """What the user said in one turn."""

    text: str
    turn: int
    language: str | None = None
    speculative: bool = False  # from a speculative segment: the turn may still go on (the LLM may judge it)
    resumes: int | None = None  # the ended turn whose words it holds too (SpeechSegment.resumes): that one is void


@dataclass(frozen=True)
class ReplyText(Data):
    """One sentence (or clause) of the assistant's reply, emitted as soon as the LLM has it."""

    text: str
    turn: int
    language: str | None = None
    spoken: bool = True  # False: a text-only reply (a realtime client's output_modalities ["text"]); no TTS
    voice: str | None = None  # the voice to say it in (a realtime client's, for one response); None: the TTS's own


@dataclass(frozen=True, eq=False)
class ReplyAudio(Data):
    """A streamed block of synthesized reply audio: float32 mono samples in [-1, 1]."""

    samples: np.ndarray
    sample_rate: int
    turn: int

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


@dataclass(frozen=True)
class SpeechStarted(Control):
    """The VAD heard the user start turn ``turn``; with ``runner.barge_in`` it cancels older turns."""

    turn: int


@dataclass(frozen=True)
class TurnConfirmed(Control):
    """The silence after speculative turn ``turn`` lasted: its reply may reach the user."""

    turn: int
    at_s: float  # input position of the confirmation


@dataclass(frozen=True)
class TurnDiscarded(Control):
    """The user went on speaking after speculative turn ``turn``: all work on it is dropped, nothing of it stays.

    The utterance continues as a later turn that holds the whole speech.
    """

    turn: int


@dataclass(frozen=True)
class TurnVerdict(Control):
    """How likely the words of speculative turn ``turn`` end the user's turn (the LLM read its transcript).

    The runner hands it back upstream to the stage that ``takes`` it (the VAD with ``turn=words``), which may
    end the turn at once; a verdict for a turn that is no longer open is ignored.
    """

    turn: int
    complete_probability: float


@dataclass(frozen=True)
class SentenceEnd(Control):
    """How likely the words of speculative turn ``turn`` end a sentence, as the STT heard them with the audio
    (Whisper's probability of a closing mark right after them). The runner hands it back to the VAD, which weighs
    the words' :class:`TurnVerdict` with it (:func:`s2s.vad.turn_detection.words_probability`)."""

    turn: int
    probability: float


@dataclass(frozen=True)
class TurnEnd(Control):
    """All of the reply to ``turn`` has been emitted upstream of this point."""

    turn: int


@dataclass(frozen=True)
class EndOfStream(Control):
    """The source has no more input; each stage flushes, then the graph drains and stops."""


@dataclass(frozen=True)
class Metric(Control):
    """A figure a stage reports about a turn (e.g. the LLM's time to first token); consumed by the runner."""

    turn: int
    name: str
    value: float
    extra: dict = field(default_factory=dict)

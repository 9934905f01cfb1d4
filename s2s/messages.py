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

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate


@dataclass(frozen=True)
class Transcript(Data):
    """What the user said in one turn."""

    text: str
    turn: int
    language: str | None = None
    speculative: bool = False  # from a speculative segment: the turn may still go on (the LLM may judge it)


@dataclass(frozen=True)
class ReplyText(Data):
    """One sentence (or clause) of the assistant's reply, emitted as soon as the LLM has it."""

    text: str
    turn: int
    language: str | None = None
    spoken: bool = True  # False: a text-only reply (a realtime client's output_modalities ["text"]); no TTS


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

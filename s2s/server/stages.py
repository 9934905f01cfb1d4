"""The stages a session adds around the configured ones: the socket as source and sink, and its own VAD.

Stages still see no JSON and no socket: the session feeds decoded audio into :class:`SocketSource` and
receives :class:`~s2s.messages.ReplyAudio` from :class:`SocketSink` through a plain callback.
"""
from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from s2s.messages import AudioChunk, Data, Message, ReplyAudio
from s2s.stage import Source, Stage

_END = None  # marks the end of a session's input
PIPELINE_RATE = 16000  # the rate a session feeds its graph: the unit of the session's input clock


class SocketSource(Source):
    """Audio a client appends, already decoded and resampled by the session, as pipeline chunks.

    Args:
        sample_rate: rate of the chunks it yields (the pipeline's rate).
    """

    live = True  # it keeps producing while the assistant speaks, like a microphone
    emits = (AudioChunk,)

    def __init__(self, sample_rate: int = PIPELINE_RATE) -> None:
        self.sample_rate = sample_rate
        self._inbox: queue.Queue[np.ndarray | None] = queue.Queue()

    def feed(self, samples: np.ndarray) -> None:
        """Queue float32 samples at ``sample_rate`` (called from the server's event loop)."""
        if len(samples):
            self._inbox.put(samples)

    def end(self) -> None:
        """No more input: the stream ends, so the graph drains and stops."""
        self._inbox.put(_END)

    def stream(self) -> Iterator[Message]:
        while True:
            samples = self._inbox.get()
            if samples is _END:
                return
            yield AudioChunk(samples, self.sample_rate)

    def describe(self) -> dict[str, Any]:
        return {"input": "the client's input_audio_buffer.append (PCM16)"}


class SocketSink(Stage):
    """Hands each block of reply audio to the session, which sends it as ``response.output_audio.delta``.

    Args:
        deliver: called with every :class:`ReplyAudio` in the sink's thread; None drops the audio.
    """

    accepts = (ReplyAudio,)

    def __init__(self, deliver: Callable[[ReplyAudio], None] | None = None) -> None:
        self.deliver = deliver

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, ReplyAudio)
        if self.deliver is not None:
            self.deliver(message)
        return iter(())

    def describe(self) -> dict[str, Any]:
        return {"output": "response.output_audio.delta (PCM16 at the client's rate)"}


class TurnCounter:
    """One sequence of turn numbers per session, shared by spoken turns (from the VAD) and typed ones."""

    def __init__(self) -> None:
        self._count = itertools.count()
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            return next(self._count)


class SessionVAD(Stage):
    """The session's own VAD (stateful, so never shared), numbering its turns in the session's sequence.

    Typed turns (``response.create`` after a text item) take numbers from the same :class:`TurnCounter`, so
    "a later turn cancels an earlier reply" holds across both kinds. ``replace`` swaps in a VAD with new
    settings (``session.update`` of turn detection) between two input chunks.

    Args:
        vad: the configured VAD stage, built for this session.
        turns: the session's turn sequence.
    """

    def __init__(self, vad: Stage, turns: TurnCounter) -> None:
        self.vad = vad
        self.accepts, self.emits = vad.accepts, vad.emits
        self._turns = turns
        self._numbers: dict[int, int] = {}  # the VAD's own turn -> the session's
        self._replacement: Stage | None = None
        self._retired: list[Stage] = []
        self._lock = threading.Lock()

    def replace(self, vad: Stage) -> None:
        """Use ``vad`` (already set up) from the next input chunk on; an utterance in progress is dropped."""
        with self._lock:
            self._replacement = vad

    def _current(self) -> Stage:
        with self._lock:
            if self._replacement is not None:
                self._retired.append(self.vad)
                self.vad, self._replacement = self._replacement, None
                self._numbers.clear()
            return self.vad

    def _renumber(self, message: Message) -> Message:
        turn = getattr(message, "turn", None)
        if turn is None:
            return message
        if turn not in self._numbers:
            self._numbers = {k: v for k, v in self._numbers.items() if k >= turn - 1}  # keep it small
            self._numbers[turn] = self._turns.next()
        return dataclasses.replace(message, turn=self._numbers[turn])

    def setup(self) -> None:
        self.vad.setup()

    def warm_up(self) -> None:
        self.vad.warm_up()

    def process(self, message: Data) -> Iterator[Message]:
        for output in self._current().process(message):
            yield self._renumber(output)

    def end_turn(self, turn: int) -> Iterator[Message]:
        return iter(())  # the VAD starts turns; nothing upstream of it can end one

    def flush(self) -> Iterator[Message]:
        for output in self._current().flush():
            yield self._renumber(output)

    def reset(self) -> None:
        self.vad.reset()

    def close(self) -> None:
        for vad in [self.vad, *self._retired, *([self._replacement] if self._replacement else [])]:
            vad.close()

    def describe(self) -> dict[str, Any]:
        return self.vad.describe()

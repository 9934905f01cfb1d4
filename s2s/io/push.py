"""A source a program pushes audio into and a sink that hands reply audio to a callback.

The realtime server's sessions (the socket) and the Python API (:mod:`s2s.api`) both put these at the ends of
a graph: stages still see messages only.
"""
from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from s2s.messages import AudioChunk, Data, Message, ReplyAudio
from s2s.stage import Source, Stage

_END = None  # marks the end of the input


class PushSource(Source):
    """Audio pushed by its owner (any thread), already at ``sample_rate``, as pipeline chunks, until :meth:`end`.

    Args:
        sample_rate: rate of the chunks it yields (the pipeline's rate).
    """

    live = True  # it keeps producing while the assistant speaks, like a microphone
    emits = (AudioChunk,)

    def __init__(self, sample_rate: int = 16000) -> None:
        self.sample_rate = sample_rate
        self._inbox: queue.Queue[np.ndarray | None] = queue.Queue()

    def feed(self, samples: np.ndarray) -> None:
        """Queue float32 mono samples at ``sample_rate``."""
        if len(samples):
            self._inbox.put(samples)

    def poke(self) -> None:
        """An empty chunk: the VAD acts on a commit or clear even when no more audio comes."""
        self._inbox.put(np.zeros(0, dtype=np.float32))

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
        return {"input": "audio the program feeds"}


class CallbackSink(Stage):
    """Hands each block of reply audio to ``deliver``, in the sink's thread.

    Args:
        deliver: called with every :class:`ReplyAudio`; None drops the audio.
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
        return {"output": "reply audio to the program's callback"}

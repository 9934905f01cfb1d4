"""Small real stages for runner tests (no models): numbers in, words out, with controllable timing."""
from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from s2s.messages import (AudioChunk, Data, Message, ReplyAudio, ReplyText, SpeechSegment, SpeechStarted,
                          Transcript, TurnConfirmed, TurnDiscarded, TurnEnd)
from s2s.stage import Source, Stage


class CountingSource(Source):
    """Yields ``turns`` audio chunks, each becoming one turn downstream."""

    def __init__(self, turns: int = 3, delay_s: float = 0.0, forever: bool = False) -> None:
        self.turns, self.delay_s, self.forever = turns, delay_s, forever

    def stream(self) -> Iterator[Message]:
        index = 0
        while self.forever or index < self.turns:
            time.sleep(self.delay_s)
            yield AudioChunk(np.full(160, index + 1, dtype=np.float32), 16000)
            index += 1


class Segmenter(Stage):
    """Every chunk with sound is an utterance (silence is counted in ``silent``); buffers the last one until flush
    to prove flush is called."""

    accepts = (AudioChunk,)

    def __init__(self, hold_last: bool = False, announce: bool = False) -> None:
        self.hold_last, self.announce = hold_last, announce
        self.turn, self.held, self.silent = 0, None, 0

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, AudioChunk)
        if not message.samples.any():
            self.silent += 1
            return
        if self.announce:
            yield SpeechStarted(self.turn)
        segment = SpeechSegment(message.samples, 16000, self.turn, 0.0, 0.01)
        self.turn += 1
        if self.hold_last:
            if self.held is not None:
                yield self.held
            self.held = segment
        else:
            yield segment

    def flush(self) -> Iterator[Message]:
        if self.held is not None:
            yield self.held
            self.held = None


class Speculator(Stage):
    """A VAD that follows a script, one action per input chunk: "speak", "spec", "discard" or "confirm".

    "spec" lets a speculative segment of the open turn go, "discard" drops it (the utterance continues as the
    next turn), "confirm" confirms it; each action's perf_counter time is kept in ``times``.
    """

    accepts = (AudioChunk,)

    def __init__(self, script: list[str]) -> None:
        self.script, self.turn, self.chunk = list(script), 0, 0
        self.times: list[tuple[str, int, float]] = []

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, AudioChunk)
        action = self.script[self.chunk] if self.chunk < len(self.script) else "speak"
        position = self.chunk * 0.5
        self.chunk += 1
        self.times.append((action, self.turn, time.perf_counter()))
        if action == "spec":
            yield SpeechSegment(message.samples, 16000, self.turn, 0.0, position, speech_end_s=position - 0.2,
                                closed_s=position, speculative=True)
        elif action == "discard":
            yield TurnDiscarded(self.turn)
            self.turn += 1
        elif action == "confirm":
            yield TurnConfirmed(self.turn, position)
            self.turn += 1


class Recognizer(Stage):
    accepts = (SpeechSegment,)

    def __init__(self, fail_on_turn: int | None = None, slow_s: float = 0.0, wordless_turns: tuple = ()) -> None:
        self.fail_on_turn, self.slow_s, self.wordless_turns = fail_on_turn, slow_s, wordless_turns

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, SpeechSegment)
        if message.turn == self.fail_on_turn:
            raise RuntimeError(f"cannot recognise turn {message.turn}")
        if message.turn in self.wordless_turns:  # as the real STT does for noise: the turn ends with no reply
            yield TurnEnd(message.turn)
            return
        time.sleep(self.slow_s)
        yield Transcript(f"turn {message.turn}", message.turn, "en")


class Talker(Stage):
    """Streams ``words`` sentences per turn with a pause between them (to observe streaming)."""

    accepts = (Transcript,)

    def __init__(self, words: int = 3, pause_s: float = 0.0) -> None:
        self.words, self.pause_s = words, pause_s
        self.closed_early = 0
        self.made: list[float] = []  # when each sentence was made (perf_counter)

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, Transcript)
        try:
            for index in range(self.words):
                if index:
                    time.sleep(self.pause_s)
                self.made.append(time.perf_counter())
                yield ReplyText(f"{message.text} word {index}.", message.turn)
            yield TurnEnd(message.turn)
        except GeneratorExit:
            self.closed_early += 1
            raise


class Voice(Stage):
    """``samples`` of a tone per sentence (none: the sentence makes no audio), after ``delay_s``."""

    accepts = (ReplyText,)

    def __init__(self, samples: int = 2400, delay_s: float = 0.0) -> None:
        self.samples, self.delay_s = samples, delay_s
        self.made: list[float] = []  # when each block was made (perf_counter)

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, ReplyText)
        time.sleep(self.delay_s)
        self.made.append(time.perf_counter())
        if self.samples:
            tone = 0.1 * np.sin(np.arange(self.samples, dtype=np.float32) * 0.1)
            yield ReplyAudio(tone.astype(np.float32), 24000, message.turn)


class Collector(Stage):
    """Records what reached the end of the graph and when."""

    def __init__(self) -> None:
        self.received: list[tuple[float, Data]] = []
        self.turn_ends: list[int] = []
        self.closed = False

    def process(self, message: Data) -> Iterator[Message]:
        self.received.append((time.perf_counter(), message))
        return iter(())

    def end_turn(self, turn: int) -> Iterator[Message]:
        self.turn_ends.append(turn)
        return iter(())

    def close(self) -> None:
        self.closed = True

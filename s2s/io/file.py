"""Read the user's speech from a file; write the reply to a file."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from s2s import audio
from s2s.config_errors import MUST_EXIST
from s2s.config_errors import RATE, Range, ValidationContext
from s2s.messages import AudioChunk, Data, Message, ReplyAudio
from s2s.stage import Source, Stage


class FileSource(Source):
    """Streams a WAV/FLAC file (any rate, width, channel count) as pipeline audio chunks.

    Args:
        path: the speech file.
        sample_rate: rate of the emitted chunks (the pipeline's rate).
        chunk_ms: length of each chunk.
        realtime: pace chunks at the speed of speech, as a microphone would, so the turn is timed as a user meets
            it; False reads the file as fast as possible (a batch job: its voice-to-voice is not a user's, the
            silence after the speech passes faster than the models' work).
        trailing_silence_ms: silence appended so the VAD sees the last utterance end.
    """

    emits = (AudioChunk,)

    def __init__(self, path: Annotated[str, MUST_EXIST], sample_rate: Annotated[int, RATE] = 16000,
                 chunk_ms: Annotated[int, Range(1, 1000)] = 32, realtime: bool = True,
                 trailing_silence_ms: Annotated[int, Range(0, 60000)] = 1000) -> None:
        self.path = Path(path).expanduser()
        self.sample_rate = sample_rate
        self.chunk_size = sample_rate * chunk_ms // 1000
        self.realtime = realtime
        self.trailing_silence_ms = trailing_silence_ms
        self._samples: np.ndarray | None = None

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        try:
            audio.probe_audio(Path(kwargs["path"]).expanduser())
        except ValueError as error:
            raise context.error("path", kwargs["path"], f"a WAV/FLAC speech file; this one {error}") from None

    def setup(self) -> None:
        samples = audio.read_audio(self.path, self.sample_rate)
        self._samples = np.concatenate([samples, audio.silence(self.trailing_silence_ms / 1000, self.sample_rate)])

    def stream(self) -> Iterator[Message]:
        assert self._samples is not None, "setup() first"
        start = time.monotonic()
        for index, block in enumerate(audio.chunks(self._samples, self.chunk_size)):
            if self.realtime:
                time.sleep(max(0.0, start + index * self.chunk_size / self.sample_rate - time.monotonic()))
            yield AudioChunk(block, self.sample_rate)

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path)}


class FileSink(Stage):
    """Writes every reply chunk, turns in order, into one WAV file (finalised on close, even after errors).

    Args:
        path: the output file; relative paths are relative to the run directory.
        sample_rate: rate of the file; null keeps the TTS's native rate.
        turn_gap_ms: silence written between the replies of consecutive turns.
    """

    accepts = (ReplyAudio,)

    def __init__(self, path: str = "reply.wav", sample_rate: Annotated[int, RATE] | None = None,
                 turn_gap_ms: Annotated[int, Range(0, 10000)] = 300) -> None:
        self.path = Path(path).expanduser()
        self.sample_rate = sample_rate
        self.turn_gap_ms = turn_gap_ms
        self._file: Any = None
        self._last_turn: int | None = None
        self.seconds_written = 0.0

    def setup(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _open(self, sample_rate: int) -> None:
        import soundfile

        self.sample_rate = self.sample_rate or sample_rate
        self._file = soundfile.SoundFile(str(self.path), "w", samplerate=self.sample_rate, channels=1,
                                         subtype="PCM_16")

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, ReplyAudio)
        if self._file is None:
            self._open(message.sample_rate)
        assert self.sample_rate is not None
        if self._last_turn is not None and message.turn != self._last_turn and self.turn_gap_ms:
            self._write(audio.silence(self.turn_gap_ms / 1000, self.sample_rate))
        self._last_turn = message.turn
        self._write(audio.resample(message.samples, message.sample_rate, self.sample_rate))
        return iter(())

    def _write(self, samples: np.ndarray) -> None:
        self._file.write(audio.float_to_int16(samples))
        self._file.flush()  # a crash later still leaves a readable file up to here
        self.seconds_written += len(samples) / (self.sample_rate or 1)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path)}


class NullSink(Stage):
    """Discards the reply audio (benchmarks measure timings only)."""

    accepts = (ReplyAudio,)

    def process(self, message: Data) -> Iterator[Message]:
        return iter(())

"""Silero VAD (the model ships inside the silero-vad wheel) as a streaming utterance detector."""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Annotated, Any

import numpy as np

from s2s import audio
from s2s.config_errors import ConfigErrors, Range, ValidationContext
from s2s.messages import AudioChunk, Data, Message, SpeechSegment, SpeechStarted
from s2s.stage import Stage, require

RATE = 16000
FRAME = 512  # Silero's step at 16 kHz (32 ms)


class SileroVAD(Stage):
    """Emits one :class:`SpeechSegment` per utterance, and :class:`SpeechStarted` once it is long enough.

    Args:
        threshold: speech probability that opens an utterance; it closes below ``threshold - 0.15``.
        min_silence_ms: silence that ends an utterance.
        min_speech_ms: shorter blips are dropped.
        speech_pad_ms: audio kept before the start and after the end of speech.
        max_speech_ms: longer speech is split into consecutive segments (never dropped); null = no limit.
        onnx: run the ONNX export through onnxruntime instead of TorchScript.
    """

    accepts = (AudioChunk,)
    emits = (SpeechSegment,)

    def __init__(self, threshold: Annotated[float, Range(0, 1, exclusive=True)] = 0.5,
                 min_silence_ms: Annotated[int, Range(0, 10000)] = 600,
                 min_speech_ms: Annotated[int, Range(0, 10000)] = 250,
                 speech_pad_ms: Annotated[int, Range(0, 2000)] = 100,
                 max_speech_ms: Annotated[int, Range(500, 3600000)] | None = None, onnx: bool = False) -> None:
        self.threshold = threshold
        self.min_silence = min_silence_ms * RATE // 1000
        self.min_speech = min_speech_ms * RATE // 1000
        self.pad_frames = max(1, -(-speech_pad_ms * RATE // 1000 // FRAME)) if speech_pad_ms else 0
        self.max_speech = max_speech_ms * RATE // 1000 if max_speech_ms else None
        self.onnx = onnx
        self._model: Any = None
        self._torch: Any = None
        self._turn = 0
        self.reset()

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        errors = []
        if not 0.0 < kwargs.get("threshold", 0.5) < 1.0:
            errors.append(context.error("threshold", kwargs["threshold"], "a probability between 0 and 1"))
        for key in ("min_silence_ms", "min_speech_ms", "speech_pad_ms"):
            if kwargs.get(key, 0) < 0:
                errors.append(context.error(key, kwargs[key], "a duration >= 0 ms"))
        max_speech, min_speech = kwargs.get("max_speech_ms"), kwargs.get("min_speech_ms", 250)
        if max_speech is not None and max_speech <= min_speech:
            errors.append(context.error("max_speech_ms", max_speech, f"null or more than min_speech_ms ({min_speech})"))
        if errors:
            raise ConfigErrors(errors)

    def setup(self) -> None:
        silero_vad = require("silero_vad", backend="vad=silero", extra=None)
        self._torch = require("torch", backend="vad=silero", extra=None)
        self._model = silero_vad.load_silero_vad(onnx=self.onnx)

    def reset(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)
        self._ring: deque[np.ndarray] = deque(maxlen=self.pad_frames or 1)
        self._speech: list[np.ndarray] = []
        self._triggered = False
        self._silence = 0  # samples of silence since the last speech frame
        self._started_sent = False
        self._position = 0  # samples consumed so far
        self._segment_start = 0
        if self._model is not None:
            self._model.reset_states()

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, AudioChunk)
        samples = audio.resample(message.samples, message.sample_rate, RATE)
        self._pending = np.concatenate([self._pending, samples])
        while len(self._pending) >= FRAME:
            frame, self._pending = self._pending[:FRAME], self._pending[FRAME:]
            with self._torch.no_grad():
                probability = float(self._model(self._torch.from_numpy(np.ascontiguousarray(frame)), RATE))
            yield from self._step(frame, probability)
            self._position += FRAME

    def _step(self, frame: np.ndarray, probability: float) -> Iterator[Message]:
        if not self._triggered:
            if probability < self.threshold:
                self._ring.append(frame)
                return
            padding = list(self._ring) if self.pad_frames else []
            self._triggered, self._speech, self._silence = True, padding, 0
            self._segment_start = self._position - FRAME * len(padding)
        self._speech.append(frame)
        self._silence = self._silence + FRAME if probability < self.threshold - 0.15 else 0
        length = FRAME * len(self._speech)
        if not self._started_sent and length - self._silence >= self.min_speech:
            self._started_sent = True
            yield SpeechStarted(self._turn)
        if self._silence >= self.min_silence:
            keep = len(self._speech) - self._silence // FRAME + self.pad_frames
            yield from self._close(self._speech[:keep], voiced=length - self._silence)
        elif self.max_speech and length >= self.max_speech:
            yield from self._close(self._speech, voiced=length - self._silence, continues=True)

    def _close(self, frames: list[np.ndarray], voiced: int, continues: bool = False) -> Iterator[Message]:
        """End the open segment; a split of continuing speech keeps the VAD triggered so nothing is lost."""
        if frames and (voiced >= self.min_speech or continues):
            samples = np.concatenate(frames)
            start = self._segment_start / RATE
            yield SpeechSegment(samples, RATE, self._turn, start, start + len(samples) / RATE)
            self._turn += 1
        self._speech, self._silence, self._started_sent = [], 0, False
        self._triggered = continues
        self._segment_start = self._position + FRAME
        self._ring.clear()

    def flush(self) -> Iterator[Message]:
        if self._speech:
            yield from self._close(self._speech, voiced=FRAME * len(self._speech) - self._silence)

    def describe(self) -> dict[str, Any]:
        return {"model": "silero_vad.onnx" if self.onnx else "silero_vad.jit (packaged)"}

"""Live audio through sounddevice (PortAudio): microphone source and speaker sink."""
from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Annotated, Any

import numpy as np

from s2s.config_errors import RATE, Range
from s2s import audio
from s2s.messages import AudioChunk, Data, Message, ReplyAudio
from s2s.stage import Source, Stage

_HINT_FILE = "use source=file source.path=<speech.wav> and/or sink=file instead"


class AudioDeviceError(RuntimeError):
    """No PortAudio library or no usable sound device: one line saying what is missing and what to use."""


def import_sounddevice(role: str) -> Any:
    try:
        import sounddevice
    except OSError as error:  # the Python package is there, the PortAudio library is not
        raise AudioDeviceError(f"{role} needs the PortAudio library, which is missing ({error}); install it "
                               f"(Debian/Ubuntu: apt-get install libportaudio2, macOS: brew install portaudio) "
                               f"or {_HINT_FILE}") from None
    except ImportError:
        raise AudioDeviceError(f"{role} needs the sounddevice package: pip install sounddevice; "
                               f"or {_HINT_FILE}") from None
    return sounddevice


def _device_error(role: str, kind: str, device: Any, error: Exception) -> AudioDeviceError:
    which = "the default" if device is None else f"'{device}'"
    return AudioDeviceError(f"{role}: no usable audio {kind} device ({which}: {error}); {_HINT_FILE}")


def _close_stream(stream: Any) -> None:
    """Stop and close a PortAudio stream (None is fine); returns None for the caller to store."""
    if stream is not None:
        stream.stop()
        stream.close()
    return None


class MicSource(Source):
    """Streams the microphone as pipeline audio chunks until stopped.

    Args:
        sample_rate: capture rate (the pipeline's rate).
        chunk_ms: block length handed to the VAD.
        audio_device: sounddevice input device index or name; null for the system default.
    """

    live = True
    emits = (AudioChunk,)

    def __init__(self, sample_rate: Annotated[int, RATE] = 16000, chunk_ms: Annotated[int, Range(1, 1000)] = 32,
                 audio_device: int | str | None = None) -> None:
        self.sample_rate = sample_rate
        self.chunk_size = sample_rate * chunk_ms // 1000
        self.audio_device = audio_device
        self._stream: Any = None
        self._blocks: queue.Queue[np.ndarray] = queue.Queue()

    def setup(self) -> None:
        sounddevice = import_sounddevice("source=mic")
        try:
            self._stream = sounddevice.InputStream(samplerate=self.sample_rate, blocksize=self.chunk_size,
                                                   channels=1, dtype="float32", device=self.audio_device,
                                                   callback=self._callback)
            self._stream.start()
        except Exception as error:  # PortAudioError, ValueError for unknown device names
            raise _device_error("source=mic", "input", self.audio_device, error) from None

    def _callback(self, indata: np.ndarray, frames: int, time: Any, status: Any) -> None:
        self._blocks.put(indata[:, 0].copy())

    def stream(self) -> Iterator[Message]:
        while self._stream is not None:
            try:
                block = self._blocks.get(timeout=0.1)
            except queue.Empty:
                continue
            yield AudioChunk(audio.to_pipeline(block, self.sample_rate), self.sample_rate)

    def close(self) -> None:
        self._stream = _close_stream(self._stream)

    def describe(self) -> dict[str, Any]:
        return {"audio_device": self.audio_device if self.audio_device is not None else "default input"}


class SpeakerSink(Stage):
    """Plays reply audio as it arrives.

    Args:
        sample_rate: playback rate; null plays at the TTS's own rate.
        audio_device: sounddevice output device index or name; null for the system default.
    """

    accepts = (ReplyAudio,)

    def __init__(self, sample_rate: Annotated[int, RATE] | None = None, audio_device: int | str | None = None) -> None:
        self.sample_rate = sample_rate
        self.audio_device = audio_device
        self._sounddevice: Any = None
        self._stream: Any = None

    def setup(self) -> None:
        self._sounddevice = import_sounddevice("sink=speaker")
        try:  # fail now, before models load, if there is no output device
            self._sounddevice.check_output_settings(device=self.audio_device, channels=1, dtype="float32",
                                                    samplerate=self.sample_rate)
        except Exception as error:
            raise _device_error("sink=speaker", "output", self.audio_device, error) from None

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, ReplyAudio)
        if self._stream is None:
            self.sample_rate = self.sample_rate or message.sample_rate
            try:
                self._stream = self._sounddevice.OutputStream(samplerate=self.sample_rate, channels=1,
                                                              dtype="float32", device=self.audio_device)
                self._stream.start()
            except Exception as error:
                raise _device_error("sink=speaker", "output", self.audio_device, error) from None
        samples = audio.resample(message.samples, message.sample_rate, self.sample_rate)
        self._stream.write(np.ascontiguousarray(samples.reshape(-1, 1)))  # blocks at playback speed
        return iter(())

    def close(self) -> None:
        self._stream = _close_stream(self._stream)

    def describe(self) -> dict[str, Any]:
        return {"audio_device": self.audio_device if self.audio_device is not None else "default output"}

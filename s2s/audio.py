"""Audio format conversion, written once: every stage goes through these helpers.

The pipeline format is a 1-D float32 numpy array in [-1, 1] plus an explicit sample rate.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

PIPELINE_DTYPE = np.float32


def to_float32(samples: Any) -> np.ndarray:
    """Any model output or buffer (numpy, torch tensor, mx.array, list; int or float) -> float32 array.

    Integer PCM is scaled to [-1, 1]; float input is kept as is (not clipped here).
    """
    if hasattr(samples, "detach"):  # torch.Tensor, without importing torch
        samples = samples.detach().cpu().float().numpy()
    array = np.asarray(samples)
    if np.issubdtype(array.dtype, np.integer):
        info = np.iinfo(array.dtype)
        scale = float(max(abs(info.min), info.max))
        offset = 0.0 if info.min < 0 else (info.max + 1) / 2  # unsigned PCM (8-bit WAV) is centred on 128
        return ((array.astype(np.float64) - offset) / scale).astype(PIPELINE_DTYPE)
    return array.astype(PIPELINE_DTYPE, copy=False)


def to_mono(samples: np.ndarray) -> np.ndarray:
    """Average channels. Accepts (n,), (n, channels) as soundfile gives, or (1, n) / (channels, n) from models."""
    if samples.ndim == 1:
        return samples
    if samples.ndim != 2:
        return samples.reshape(-1)
    channel_axis = 1 if samples.shape[0] >= samples.shape[1] else 0
    return samples.mean(axis=channel_axis).astype(samples.dtype, copy=False)


class StreamResampler:
    """Resamples one continuous stream that arrives in blocks, with no clicks at the block edges.

    Resampling each block on its own restarts the filter at every edge (an audible click per block): soxr's
    stream keeps the filter state across blocks and holds back a few milliseconds, which :meth:`flush` gives
    at the end of the stream.
    """

    def __init__(self, rate_in: int, rate_out: int) -> None:
        self.rate_in, self.rate_out = rate_in, rate_out
        self._stream: Any = None
        if rate_in != rate_out:
            import soxr

            self._stream = soxr.ResampleStream(rate_in, rate_out, 1, dtype="float32")

    def feed(self, samples: np.ndarray) -> np.ndarray:
        """The next block at ``rate_out`` (mono float32)."""
        samples = np.ascontiguousarray(samples, dtype=PIPELINE_DTYPE)
        return samples if self._stream is None else self._stream.resample_chunk(samples)

    def flush(self) -> np.ndarray:
        """The end of the stream: what the filter still holds."""
        if self._stream is None:
            return np.zeros(0, PIPELINE_DTYPE)
        return self._stream.resample_chunk(np.zeros(0, PIPELINE_DTYPE), last=True)


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """High-quality resampling of mono float32 audio (soxr), all of it at once (see :class:`StreamResampler`)."""
    if rate_in == rate_out or len(samples) == 0:
        return samples
    import soxr

    return soxr.resample(samples, rate_in, rate_out).astype(PIPELINE_DTYPE, copy=False)


def to_pipeline(samples: Any, rate_in: int, rate_out: int | None = None) -> np.ndarray:
    """Convert any model output to the pipeline format: float32, mono, optionally resampled, NaN-free."""
    array = to_mono(to_float32(samples))
    if not np.all(np.isfinite(array)):
        array = np.nan_to_num(array, nan=0.0, posinf=1.0, neginf=-1.0)
    return resample(array, rate_in, rate_out) if rate_out else array


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    """float32 [-1, 1] -> int16 PCM, clipping out-of-range values."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


def int16_to_float(samples: np.ndarray) -> np.ndarray:
    return samples.astype(PIPELINE_DTYPE) / 32768.0


def read_audio(path: str | Path, sample_rate: int) -> np.ndarray:
    """Read a WAV/FLAC/OGG file of any rate, width and channel count as pipeline audio at ``sample_rate``."""
    import soundfile

    data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    return to_pipeline(data, rate, sample_rate)


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """``samples`` as a 16-bit PCM WAV file in memory (what an HTTP API takes as an upload or a base64 part)."""
    import io

    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def probe_audio(path: str | Path) -> tuple[int, int, float]:
    """(sample rate, channels, seconds) from the file header, or ValueError saying why it is not usable audio."""
    import soundfile

    path = Path(path)
    if path.is_dir():
        raise ValueError("is a directory, not an audio file")
    if path.stat().st_size == 0:
        raise ValueError("is empty (0 bytes)")
    try:
        info = soundfile.info(str(path))
    except Exception as error:  # soundfile raises its own LibsndfileError / RuntimeError subclasses
        raise ValueError(f"is not a readable audio file ({error})") from None
    if info.frames == 0:
        raise ValueError("contains no audio frames")
    return info.samplerate, info.channels, info.frames / info.samplerate


def chunks(samples: np.ndarray, size: int) -> Iterator[np.ndarray]:
    """Consecutive blocks of ``size`` samples; the last one is zero-padded to full size."""
    for start in range(0, len(samples), size):
        block = samples[start:start + size]
        if len(block) < size:
            block = np.pad(block, (0, size - len(block)))
        yield block


def reblock(blocks: Iterator[np.ndarray], size: int) -> Iterator[np.ndarray]:
    """Pipeline-format ``blocks`` regrouped into blocks of ``size`` samples, as soon as each is full; the
    last may be shorter (never padded: padding would be silence the listener waits through). Closing this
    generator closes ``blocks``."""
    pending: list[np.ndarray] = []
    held = 0
    try:
        for block in blocks:
            pending.append(block)
            held += len(block)
            if held < size:
                continue
            joined = np.concatenate(pending)
            full = len(joined) - len(joined) % size
            yield from (joined[start:start + size] for start in range(0, full, size))
            pending, held = [joined[full:]], len(joined) - full
        if held:
            yield np.concatenate(pending)
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()


def silence(seconds: float, sample_rate: int) -> np.ndarray:
    return np.zeros(int(round(seconds * sample_rate)), dtype=PIPELINE_DTYPE)


SILENCE_LEVEL = 0.005  # about -46 dBFS: below this a sample counts as silence when shaping reply audio


# Where speech has stopped sounding: no sample above 2% of the speech's peak and six times the background's RMS
# level (some real recordings hiss at 2-3% of their peak). The benchmarks find the end of a file's speech so, and
# the VAD starts work on a turn when a pause has been that quiet for a while (Silero hears speech ~0.1 s past it).
QUIET_OF_PEAK = 0.02
QUIET_OF_FLOOR = 6


def sound_level(peak: float, floor: float, of_peak: float = QUIET_OF_PEAK) -> float:
    """The level a sample must pass to count as sound, after speech that peaked at ``peak`` over a background
    whose RMS level is ``floor``."""
    return max(of_peak * peak, QUIET_OF_FLOOR * floor)


def sound_bounds(samples: np.ndarray, level: float = SILENCE_LEVEL) -> tuple[int, int] | None:
    """(first, end) sample indices of the audible part of ``samples``, or None if it is all silence."""
    loud = np.flatnonzero(np.abs(samples) >= level)
    return (int(loud[0]), int(loud[-1]) + 1) if len(loud) else None


class PauseShaper:
    """Shortens the silence a TTS puts around each reply chunk, without ever delaying sound.

    Many models pad every synthesis with a quarter second of silence before the speech and half a second after
    it, so the reply starts late and sentences are far apart. Feed one chunk's blocks in order and call
    :meth:`finish` after its last block: the silence before the first sound is cut to ``lead_s``; silence at the
    end of a block is held back, released in full if more sound follows (a pause inside the chunk) and cut to
    ``tail_s`` if the chunk ends there. Blocks with sound come out as soon as they arrive.
    """

    def __init__(self, sample_rate: int, lead_s: float, tail_s: float) -> None:
        self.lead = round(lead_s * sample_rate)
        self.tail = round(tail_s * sample_rate)
        self._started = False
        self._held: list[np.ndarray] = []  # trailing silence seen so far (before the first sound: the lead-in)

    def feed(self, block: np.ndarray) -> np.ndarray:
        bounds = sound_bounds(block)
        if bounds is None:
            self._held.append(block)
            if not self._started:  # only the last `lead` samples of a lead-in are ever kept
                self._held = [_last(np.concatenate(self._held), self.lead)]
            return block[:0]
        first, end = bounds
        before = np.concatenate([*self._held, block[:first]])
        if not self._started:
            before, self._started = _last(before, self.lead), True
        self._held = [block[end:]]
        return np.concatenate([before, block[first:end]])

    def finish(self) -> np.ndarray:
        """The chunk ended: at most ``tail_s`` of the silence held back after its last sound."""
        held = np.concatenate(self._held) if self._held and self._started else np.zeros(0, PIPELINE_DTYPE)
        self._held, self._started = [], False
        return held[:self.tail]


def _last(samples: np.ndarray, count: int) -> np.ndarray:
    return samples[len(samples) - count:] if count else samples[:0]

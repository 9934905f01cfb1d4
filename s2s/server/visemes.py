"""Visemes: the mouth shapes of a reply's audio, timed on it, for avatar clients.

A session that asks (``session.audio.output.visemes``, starting as ``server.visemes``) gets, before each block of
a reply's audio deltas, one ``speech_to_speech.output_audio.visemes`` event with the shapes of that block, as
the reference system (huggingface/speech-to-speech 1.1) sends them::

    {"type": "speech_to_speech.output_audio.visemes", "event_id": ..., "response_id": ..., "item_id": ...,
     "output_index": 0, "content_index": 0,
     "visemes": [{"viseme": 0, "start_s": 0.0, "end_s": 0.06}, {"viseme": 2, "start_s": 0.06, "end_s": 0.14}]}

``viseme`` is a Microsoft (Azure) viseme id (0 silence, 1-21 mouth shapes); ``start_s`` and ``end_s`` are seconds
on the response's audio, from its first sample. The shapes tile the audio sent: each event starts where the
audio sent before it ends, and the last one ends where the reply's audio ends.

The shapes come from the audio itself, 20 ms at a time, not from a model or the text: so they work offline for
every TTS backend and language, follow the audio's own pauses and speaking rate, and cost a few milliseconds per
second of audio. A quiet frame (relative to the reply's loudest so far) is silence (0); a frame whose energy
lies mostly above 2.5 kHz is a sibilant, ``s``/``z`` (15) or ``sh`` (16) by where that energy centres; any other
voiced frame is a vowel-like shape chosen by its two lowest formants (from an LPC fit), nearest to the formants
of English vowels: ``i`` (6), ``e`` (4), ``a``/schwa (1), ``ah`` (2), ``aw`` (3), ``o`` (8), ``u`` (7). Consonants
without such a mark (``p``, ``t``, ``k``, ``m``, ``n``, ``l``) take the shape of the vowel they lean on or of
silence; an avatar blending the shapes sees the jaw and lips move with the sound.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from s2s.server.protocol import event

EVENT = "speech_to_speech.output_audio.visemes"
SILENT = 0
FRAME_S = 0.02  # one shape per frame; a block's frames are stretched to tile it (10-30 ms each)
FLOOR_DB = -60.0  # a frame below this level (dBFS) is silence whatever the reply's loudness
RANGE_DB = 42.0  # ... and so is a frame this far below the reply's loudest frame so far
LPC_RATE = 11000  # formants are fitted on the band below half this rate (the first two lie under 3 kHz)
LPC_ORDER = 12
# (F1, F2) in Hz of American English vowels, men's voices (after Peterson and Barney 1952, with o and schwa added)
# -> the viseme of each
VOWELS = ((270, 2290, 6), (400, 1990, 6), (530, 1840, 4), (660, 1720, 1), (620, 1190, 1), (500, 1500, 1),
          (750, 1100, 2), (590, 880, 3), (470, 900, 8), (320, 900, 7))
SIBILANT_SHARE = 0.6  # a frame with this share of its energy above 2.5 kHz is a sibilant
S_CENTROID_HZ = 4800  # ... an s or z when that energy centres above this, else an sh


class VisemeTrack:
    """One response's visemes: each block of its audio in, that block's timed shapes out.

    The track keeps the response's clock (seconds of audio so far) and its loudest frame, so silence is judged
    against the voice's own level and every block's shapes start where the last block's ended.
    """

    def __init__(self) -> None:
        self.offset_s = 0.0
        self.peak_db = FLOOR_DB

    def feed(self, samples: np.ndarray, rate: int) -> list[dict[str, Any]]:
        """The shapes of ``samples`` (float mono at ``rate``, the audio that goes out next), tiling it.

        Returns:
            ``{"viseme", "start_s", "end_s"}`` dicts in order, runs of one shape merged; none for no samples.
        """
        if len(samples) == 0:
            return []
        count = max(1, round(len(samples) / (FRAME_S * rate)))
        edges = np.linspace(0, len(samples), count + 1).round().astype(int)
        shapes, self.peak_db = classify(samples.astype(np.float64), edges, rate, self.peak_db)
        shapes = despeckle(shapes)
        cues = []
        for index, shape in enumerate(shapes):
            start = round(self.offset_s + int(edges[index]) / rate, 3)
            end = round(self.offset_s + int(edges[index + 1]) / rate, 3)
            if cues and cues[-1]["viseme"] == shape:
                cues[-1]["end_s"] = end
            else:
                cues.append({"viseme": int(shape), "start_s": start, "end_s": end})
        self.offset_s += len(samples) / rate
        return cues


def visemes_event(ids: dict[str, Any], cues: list[dict[str, Any]]) -> dict[str, Any]:
    """The event for ``cues``; ``ids``: the response's ``response_id``, ``item_id``, output and content index."""
    return event(EVENT, **ids, visemes=cues)


def classify(samples: np.ndarray, edges: np.ndarray, rate: int, peak_db: float) -> tuple[np.ndarray, float]:
    """One viseme id per frame ``samples[edges[i]:edges[i + 1]]``, and the loudest level with these frames.

    Args:
        peak_db: the loudest frame of the reply so far (dBFS): silence is judged against it.
    """
    lengths = np.diff(edges)
    size = max(int(lengths.max()), int(FRAME_S * rate))  # a block's last few samples still get a full spectrum
    frames, window = np.zeros((len(lengths), size)), np.zeros((len(lengths), size))
    for index, (start, length) in enumerate(zip(edges[:-1], lengths)):
        frames[index, :length] = samples[start:start + length]
        window[index, :length] = np.hanning(length + 2)[1:-1]
    level = 10 * np.log10(np.maximum((frames ** 2).sum(axis=1) / lengths, 1e-12))
    peak_db = max(peak_db, float(level.max()))
    silent = level < max(FLOOR_DB, peak_db - RANGE_DB)
    nfft = 1 << int(np.ceil(np.log2(2 * size)))  # twice the frame: the autocorrelation below is not circular
    emphasised = np.concatenate([frames[:, :1], frames[:, 1:] - 0.97 * frames[:, :-1]], axis=1) * window
    power = np.abs(np.fft.rfft(emphasised, nfft)) ** 2
    hz = np.fft.rfftfreq(nfft, 1 / rate)
    total = power.sum(axis=1) + 1e-20
    high = power[:, hz >= 2500]
    sibilant = high.sum(axis=1) / total >= SIBILANT_SHARE
    centroid = (high * hz[hz >= 2500]).sum(axis=1) / (high.sum(axis=1) + 1e-20)
    shapes = np.where(silent, SILENT, np.where(centroid >= S_CENTROID_HZ, 15, 16))
    vowel = ~silent & ~sibilant  # only these need formants (the costly part)
    if vowel.any():
        shapes[vowel] = nearest_vowel(*formants(power[vowel][:, hz < LPC_RATE / 2], rate / nfft))
    return shapes, peak_db


def formants(power: np.ndarray, bin_hz: float) -> tuple[np.ndarray, np.ndarray]:
    """The two lowest formants (Hz) of each frame from its power spectrum's low band (NaN where none is found).

    The band's inverse transform is the autocorrelation of the frame low-passed and resampled to twice the
    band's width; Levinson-Durbin gives its LPC polynomial, whose narrow resonances are the formants.
    """
    band_rate = 2 * bin_hz * (power.shape[1] - 1)
    corr = np.fft.irfft(power, axis=1)[:, :LPC_ORDER + 1]
    corr[:, 0] *= 1.0 + 1e-9  # a little white noise keeps a pure tone's fit stable
    count = len(power)
    coeffs = np.zeros((count, LPC_ORDER + 1))
    coeffs[:, 0] = 1.0
    error = corr[:, 0].copy() + 1e-20
    for order in range(1, LPC_ORDER + 1):
        reflection = -(coeffs[:, :order] * corr[:, order:0:-1]).sum(axis=1) / error
        coeffs[:, 1:order + 1] = coeffs[:, 1:order + 1] + reflection[:, None] * coeffs[:, order - 1::-1][:, :order]
        error = error * (1.0 - reflection ** 2) + 1e-20
    companion = np.zeros((count, LPC_ORDER, LPC_ORDER))
    companion[:, 0, :] = -coeffs[:, 1:]
    companion[:, np.arange(1, LPC_ORDER), np.arange(LPC_ORDER - 1)] = 1.0
    roots = np.linalg.eigvals(companion)
    hz = np.angle(roots) * band_rate / (2 * np.pi)
    bandwidth = -np.log(np.maximum(np.abs(roots), 1e-9)) * band_rate / np.pi
    usable = (roots.imag > 0) & (hz > 180) & (bandwidth < 500)
    ordered = np.sort(np.where(usable, hz, np.inf), axis=1)
    first, second = ordered[:, 0], ordered[:, 1]
    return np.where(np.isfinite(first), first, np.nan), np.where(np.isfinite(second), second, np.nan)


def nearest_vowel(f1: np.ndarray, f2: np.ndarray) -> np.ndarray:
    """Per frame, the viseme of the English vowel whose (F1, F2) is nearest on a log scale; schwa's (1) if unknown."""
    known = np.isfinite(f1) & np.isfinite(f2)
    table = np.array(VOWELS, dtype=float)
    distance = ((np.log(np.where(known, f1, 500)[:, None] / table[None, :, 0]) ** 2)
                + (np.log(np.where(known, f2, 1500)[:, None] / table[None, :, 1]) ** 2))
    return np.where(known, table[np.argmin(distance, axis=1), 2].astype(int), 1)


def despeckle(shapes: np.ndarray) -> np.ndarray:
    """A lone frame between two frames of one shape takes theirs: a 20 ms flicker is noise, not a mouth move.

    Left to right, each frame compared with its corrected predecessor, so an alternation (7 8 7 8 7) settles.
    """
    out = shapes.copy()
    for index in range(1, len(out) - 1):
        if out[index - 1] == shapes[index + 1] != shapes[index]:
            out[index] = out[index - 1]
    return out

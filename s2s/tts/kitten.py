"""KittenTTS (KittenML, Apache-2.0 weights, 15-80M parameters) on onnxruntime, phonemes from the espeak-ng program.

The published ONNX models (``type`` ONNX1/ONNX2 in their ``config.json``: nano 0.1/0.2/0.8, micro 0.8, mini 0.8)
take ``input_ids`` (int64 [1, N]: ``0``, the symbols, ``10``, ``0``), ``style`` (float32 [1, 256]: a row of the
voice's array in ``voices.npz``, picked by the text's length) and ``speed`` (float32 [1], times the voice's
``speed_priors`` entry), and give ``waveform`` (float32, 24 kHz) whose last 5000 samples are an artefact cut off.
The IPA comes from espeak-ng run as a program (:mod:`s2s.tts.espeak`), as KittenML's own code gets it from the
GPL ``phonemizer`` package with punctuation kept; words and marks are then spaced apart as its tokenizer does.
A hub id is fetched with huggingface_hub into the Hugging Face cache the first time, and read from there offline.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from s2s.config_errors import ConfigError, ConfigErrors, Range, ValidationContext
from s2s.models import local_path
from s2s.onnx import cpu_session
from s2s.stage import require
from s2s.tts.base import TTSStage
from s2s.tts.espeak import Espeak, missing_here, pieces

log = logging.getLogger(__name__)

OWNER = "KittenML"  # a bare model name (kitten-tts-nano-0.8) is one of KittenML's, as its own loader reads it
ONNX_TYPES = ("ONNX1", "ONNX2")  # config.json "type" of the ONNX models; KITTEN2 models need torch: not these
VOICES_FILE = "voices.npz"
# The voices of every published model (0.8 configs alias the names to the expr-voice ones); checked before a hub
# model is fetched, then against the model's own voices.npz
PUBLISHED_VOICES = ("Bella", "Jasper", "Luna", "Bruno", "Rosie", "Hugo", "Kiki", "Leo",
                    *(f"expr-voice-{number}-{sex}" for number in range(2, 6) for sex in "mf"))
SPEEDS = Range(0.5, 2.0)  # KittenML's demo range; the voice's speed prior multiplies it
# The models' symbol table (StyleTTS 2's): pad, punctuation, ASCII letters, IPA. A symbol's id is its position; the
# straight quote stands three times (where the original has typographic quotes) and takes the last position.
SYMBOLS = ("$" + ';:,.!?¡¿—…"«»"" ' + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
           + "ɑɐɒæɓʙβɔɕçɗɖðʤəɘɚɛɜɝɞɟʄɡɠɢʛɦɧħɥʜɨɪʝɭɬɫɮʟɱɯɰŋɳɲɴøɵɸθœɶʘɹɺɾɻʀʁɽʂʃʈʧʉʊʋⱱʌɣɤʍχʎʏʑʐʒʔʡʕʢ"
           + "ǀǁǂǃˈˌːˑʼʴʰʱʲʷˠˤ˞↓↑→↗↘'̩'ᵻ")
IDS = {symbol: index for index, symbol in enumerate(SYMBOLS)}
PAD, END = 0, 10  # input_ids are 0, symbols, 10 (…), 0 as KittenML's runtime builds them
POSITIONS = 512  # the models' context, boundary ids included
TRIM = 5000  # samples at the end of every waveform that KittenML's runtime cuts off
ESPEAK_VOICE = "en-us"  # the models speak American English
WORDS = re.compile(r"\w+|[^\w\s]")  # KittenML's tokenizer: words and single marks, then joined by spaces


@dataclass(frozen=True)
class Layout:
    """The files of a model folder and what its ``config.json`` says about the voices."""

    onnx: Path
    voices: Path
    aliases: dict[str, str] = field(default_factory=dict)  # Bella -> expr-voice-2-f
    priors: dict[str, float] = field(default_factory=dict)  # expr-voice-4-m -> 0.9, times the speed

    def voice_names(self) -> list[str]:
        """The names ``voice`` takes: the aliases whose voice the archive has, then the archive's own names."""
        try:
            with np.load(self.voices) as archive:
                names = list(archive.files)
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            raise ValueError(f"a KittenTTS folder whose {self.voices.name} is a numpy archive of voices "
                             f"({type(error).__name__}: {error})") from None
        return [alias for alias, name in self.aliases.items() if name in names] + names


def read_folder(folder: Path) -> Layout:
    """The layout of a model folder; ``ValueError`` says what a valid one is."""
    layout = f"a KittenTTS folder (config.json naming the .onnx and {VOICES_FILE}, or one .onnx and {VOICES_FILE})"
    if not folder.is_dir():
        raise ValueError(f"{layout}: no such folder")
    if not (folder / "config.json").is_file():
        onnx = sorted(folder.glob("*.onnx"))
        if len(onnx) != 1 or not (folder / VOICES_FILE).is_file():
            raise ValueError(f"{layout}: it has {len(onnx)} .onnx file(s) and "
                             f"{'a' if (folder / VOICES_FILE).is_file() else 'no'} {VOICES_FILE}")
        return Layout(onnx[0], folder / VOICES_FILE)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        kind, onnx, voices = config.get("type"), folder / config["model_file"], folder / config["voices"]
        aliases = {str(alias): str(name) for alias, name in (config.get("voice_aliases") or {}).items()}
        priors = {str(name): float(prior) for name, prior in (config.get("speed_priors") or {}).items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{layout}: its config.json is not a KittenTTS one "
                         f"({type(error).__name__}: {error})") from None
    if kind not in ONNX_TYPES:
        raise ValueError(f"{layout} of type {' or '.join(ONNX_TYPES)} (its config.json says {kind})")
    if missing := [path.name for path in (onnx, voices) if not path.is_file()]:
        raise ValueError(f"{layout}: it has no {' and no '.join(missing)}")
    return Layout(onnx, voices, aliases, priors)


def hub_id(model: str) -> str:
    return model if "/" in model else f"{OWNER}/{model}"


def cached_folder(repo: str) -> Path | None:
    """The Hugging Face cache's snapshot of ``repo`` when it holds the whole model, else None (no network)."""
    if importlib.util.find_spec("huggingface_hub") is None:
        return None
    import huggingface_hub

    config = huggingface_hub.try_to_load_from_cache(repo, "config.json")
    if not isinstance(config, str):
        return None
    try:
        read_folder(Path(config).parent)
    except ValueError:
        return None
    return Path(config).parent


def fetch(repo: str) -> Path:
    """``repo``'s config.json, .onnx and voices from the hub into the Hugging Face cache; the snapshot folder."""
    import huggingface_hub

    config = Path(huggingface_hub.hf_hub_download(repo, "config.json"))
    names = json.loads(config.read_text(encoding="utf-8"))
    for name in (names["model_file"], names["voices"]):
        huggingface_hub.hf_hub_download(repo, name)
    return config.parent


def how_to_get(repo: str) -> str:
    return (f"run once with the hub reachable (config.json, the .onnx and {VOICES_FILE} of {repo}, 25-80 MB, go "
            f"into the Hugging Face cache), or on a machine with the hub run `hf download {repo} --local-dir "
            f"{repo.rpartition('/')[2]}`, copy that folder here and set tts.model to its path")


class KittenTTS(TTSStage):
    """KittenTTS through onnxruntime: small, fast on a CPU, no torch and no GPL code in the process.

    Args:
        model: a hub id (``KittenML/kitten-tts-mini-0.8``, or a bare name of KittenML's), fetched once into the
            Hugging Face cache; or a local folder with the model's ``config.json``, ``.onnx`` and ``voices.npz``
            (or one ``.onnx`` and ``voices.npz``).
        voice: a name of the model's ``config.json`` aliases (Bella, Jasper, Luna, Bruno, Rosie, Hugo, Kiki, Leo)
            or of its ``voices.npz`` (expr-voice-2-m ... expr-voice-5-f).
        speed: speaking rate (1.0 = the voice's own; multiplied by the model's speed prior for the voice).
    """

    voice_key = "voice"
    speed_key = "speed"
    runtime_keys = frozenset({"voice", "speed"})  # a voice is a row of an array already loaded; speed an input

    sample_rate = 24000

    def __init__(self, model: str = "KittenML/kitten-tts-mini-0.8", voice: str = "Bruno",
                 speed: Annotated[float, SPEEDS] = 1.0) -> None:
        self.model = model
        self.voice = voice
        self.speed = speed
        self._session: Any = None
        self._missing: set[str] = set()
        self._espeak: Espeak | None = None  # the running espeak-ng (setup), stopped at close

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        model, voice = kwargs["model"], kwargs["voice"]
        errors: list[ConfigError] = []
        if (missing := missing_here(context)) is not None:
            errors.append(context.error("model", model, f"a model whose phonemes can be made here: it needs {missing}"))
        path = local_path(model)
        folder = path if path is not None else cached_folder(hub_id(model))  # a hub model's voices once fetched
        if folder is None:
            names, where = list(PUBLISHED_VOICES), "a voice of the published KittenTTS models"
        else:
            try:
                names, where = read_folder(folder).voice_names(), f"the voices of {model if path else hub_id(model)}"
            except ValueError as problem:
                raise ConfigErrors([*errors, context.error("model", model, str(problem))]) from None
        if voice not in names:
            errors.append(context.error("voice", voice, f"{where}: {', '.join(names)}"))
        if errors:
            raise ConfigErrors(errors)

    def setup(self) -> None:
        onnxruntime = require("onnxruntime", backend="tts=kitten", extra=None)
        self._espeak = Espeak(ESPEAK_VOICE, backend="tts=kitten")
        layout = read_folder(self._folder())
        with np.load(layout.voices) as archive:
            self._voices = {name: archive[name].astype(np.float32) for name in archive.files}
        self._layout = layout
        self.settings_changed({"voice"})  # an unknown voice fails before the model loads
        self._session = cpu_session(onnxruntime, layout.onnx, self.threads)
        inputs = {node.name for node in self._session.get_inputs()}
        if inputs != {"input_ids", "style", "speed"}:
            raise RuntimeError(f"tts=kitten: {layout.onnx} takes {', '.join(sorted(inputs))}, not a KittenTTS "
                               "ONNX model's input_ids, style and speed")

    def _folder(self) -> Path:
        """The model folder: the local one, the cached snapshot, or the snapshot fetched now."""
        if (path := local_path(self.model)) is not None:
            return path
        huggingface_hub = require("huggingface_hub", backend="tts=kitten", extra=None)
        repo = hub_id(self.model)
        if (snapshot := cached_folder(repo)) is not None:
            return snapshot
        if huggingface_hub.is_offline_mode():
            raise RuntimeError(f"tts=kitten: tts.model={self.model} is not in the Hugging Face cache and "
                               f"HF_HUB_OFFLINE=1 forbids fetching it; {how_to_get(repo)}")
        log.info("tts=kitten: fetching %s from the hub once (later starts read the cache)", repo)
        try:
            return fetch(repo)
        except Exception as error:  # no network, no such repo, a proxy: say what to do instead
            raise RuntimeError(f"tts=kitten: tts.model={self.model} could not be fetched ({type(error).__name__}: "
                               f"{error}); {how_to_get(repo)}") from error

    def settings_changed(self, keys: set[str]) -> None:
        name = self._layout.aliases.get(self.voice, self.voice)
        if name not in self._voices:
            raise ValueError(f"tts.voice={self.voice}: invalid; expected a voice of {self.model}: "
                             f"{', '.join(self._layout.voice_names())}")
        self._styles = self._voices[name].reshape(-1, self._voices[name].shape[-1])
        self._speed = np.array([self.speed * self._layout.priors.get(name, 1.0)], dtype=np.float32)

    def symbol_ids(self, phonemes: str) -> list[int]:
        """The ids of the phonemes, words and marks spaced apart (symbols the table lacks are left out)."""
        ids = []
        for symbol in " ".join(WORDS.findall(phonemes)):
            if symbol in IDS:
                ids.append(IDS[symbol])
            elif symbol not in self._missing:
                self._missing.add(symbol)
                log.warning("tts=kitten: the model has no id for phoneme %r; it is left out", symbol)
        return ids

    def _runs(self, ids: list[int]) -> Iterator[list[int]]:
        """The ids in runs that fit the model's positions, cut at the last space before the limit."""
        limit, space = POSITIONS - 3, IDS[" "]
        while len(ids) > limit:
            cut = next((index for index in range(limit, 0, -1) if ids[index] == space), limit)
            yield ids[:cut]
            ids = ids[cut + (ids[cut] == space):]
        yield ids

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        for number, sentence in enumerate(self._espeak.sentences(text)):
            for piece in pieces(sentence, first=number == 0):
                phonemes = "".join(clause.phonemes for clause in piece)
                if not any(character.isalpha() for character in phonemes):
                    continue  # punctuation alone ("...") would be a model call for a click
                # KittenML's runtime picks the style row by the length of the text it speaks
                row = min(len(" ".join(clause.text for clause in piece)), len(self._styles) - 1)
                for ids in self._runs(self.symbol_ids(phonemes)):
                    inputs = {"input_ids": np.array([[PAD, *ids, END, PAD]], dtype=np.int64),
                              "style": self._styles[row:row + 1], "speed": self._speed}
                    waveform = np.ravel(self._session.run(None, inputs)[0])
                    if len(waveform) > TRIM:
                        yield waveform[:-TRIM]

    def close(self) -> None:
        self._session = None
        if self._espeak is not None:
            self._espeak.close()

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "voice": self.voice, "device": "cpu"}

"""Supertonic-3 (Supertone: 44.1 kHz, 31 languages and ``na``) through the ``supertonic`` package on onnxruntime.

The package's ``TTS.synthesize`` makes a whole text in one call; here its engine (``supertonic.core.Supertonic``:
duration predictor, text encoder, ``total_steps`` flow-matching steps, vocoder) runs once per sentence, so the first
sentence plays while the next is made. The four ONNX sessions come from :func:`s2s.onnx.cpu_session` (the runner's
thread budget, shared while the realtime server shares weights); config, text processor and voice styles from the
package's loader. The package ships no weights: ``model: null`` has it download Supertonic-3 from Hugging Face
(``Supertone/supertonic-3`` at the revision the package pins) once into the cache folder.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from s2s.config_errors import ConfigError, OneOf, Range, ValidationContext
from s2s.models import build_once, cache_root
from s2s.onnx import cpu_session
from s2s.stage import require
from s2s.text import SentenceSplitter, has_words
from s2s.tts.base import TTSStage

log = logging.getLogger(__name__)

MODEL_NAME = "supertonic-3"  # the package's name for the weights it downloads (supertonic.config.MODEL_CONFIGS)
HUB_REPO = "Supertone/supertonic-3"
VOICES = ("M1", "M2", "M3", "M4", "M5", "F1", "F2", "F3", "F4", "F5")  # the ten styles Supertonic-3 ships
# supertonic.config.AVAILABLE_LANGUAGES of 1.3.1, as the reference system lists them: 31 languages, then "na", the
# language-agnostic token for text in none of them
LANGUAGES = ("en", "ko", "ja", "ar", "bg", "cs", "da", "de", "el", "es", "et", "fi", "fr", "hi", "hr", "hu", "id",
             "it", "lt", "lv", "nl", "pl", "pt", "ro", "ru", "sk", "sl", "sv", "tr", "uk", "vi", "na")
SPEEDS = Range(0.7, 2.0)  # supertonic.config.MIN_SPEED, MAX_SPEED: the engine refuses others
STEPS = Range(1, 100)  # supertonic.config.MIN_TOTAL_STEPS, MAX_TOTAL_STEPS (its docs: 5 low to 12 high quality)
# The files supertonic.loader reads from a model folder (checked before loading, without importing the package)
LAYOUT = ("onnx/duration_predictor.onnx", "onnx/text_encoder.onnx", "onnx/vector_estimator.onnx",
          "onnx/vocoder.onnx", "onnx/tts.json", "onnx/unicode_indexer.json")
STYLES = "voice_styles"


def model_error(model: str, voice: str, context: ValidationContext) -> ConfigError | None:
    """What is wrong with a local model folder for ``voice``, as one error naming its key, or None."""
    folder = Path(model).expanduser()
    layout = f"a Supertonic model folder ({', '.join(LAYOUT)}, {STYLES}/<voice>.json)"
    if not folder.is_dir():
        return context.error("model", model, f"null (Supertonic-3, downloaded once) or {layout}: no such folder")
    if missing := [name for name in LAYOUT if not (folder / name).is_file()]:
        return context.error("model", model, f"{layout}: it has no {', '.join(missing)}")
    if not (folder / STYLES / f"{voice}.json").is_file():
        present = sorted(path.stem for path in (folder / STYLES).glob("*.json"))
        return context.error("voice", voice, f"a voice of {STYLES}/ in {model}: {', '.join(present) or 'none'}")
    return None


def turn_code(language: str) -> str:
    """A turn's language as a Supertonic code: ``en-US``, ``pt_BR`` and ``en-auto`` become ``en``, ``pt``, ``en``."""
    return re.split(r"[-_]", language.strip().lower(), maxsplit=1)[0]


class SupertonicTTS(TTSStage):
    """Supertonic-3 through the ``supertonic`` package: multilingual, fast on a CPU, sentence by sentence.

    Args:
        voice: one of the ten built-in styles, M1-M5 (male) and F1-F5 (female).
        language: the code for turns that bring none, or one Supertonic lacks (a turn's own code is used when it
            is one of ``LANGUAGES``); ``na`` is the language-agnostic fallback, the reference system's default.
        speed: speaking rate from 0.7 to 2.0 (1.0 = the model's own; the duration is divided by it).
        total_steps: flow-matching steps per sentence: more is cleaner and slower (the package's default, 8).
        model: a folder in the package's layout (``onnx/`` with the four graphs, ``tts.json`` and
            ``unicode_indexer.json``; ``voice_styles/``), e.g. ``~/.cache/supertonic3`` where the package itself
            downloads; null: Supertonic-3, downloaded once by the package into ``cache_dir``.
        cache_dir: where ``model: null`` is downloaded (null: the user cache folder).
    """

    voice_key = "voice"
    speed_key = "speed"
    runtime_keys = frozenset({"voice", "language", "speed", "total_steps"})  # read per sentence; a voice is a JSON

    sample_rate = 44100

    def __init__(self, voice: Annotated[str, OneOf(VOICES)] = "M1", language: Annotated[str, OneOf(LANGUAGES)] = "na",
                 speed: Annotated[float, SPEEDS] = 1.0, total_steps: Annotated[int, STEPS] = 8,
                 model: str | None = None, cache_dir: str | None = None) -> None:
        self.voice = voice
        self.language = language
        self.speed = speed
        self.total_steps = total_steps
        self.model = model
        self.cache_dir = cache_dir
        self._engine: Any = None  # supertonic.core.Supertonic, from setup
        self._loader: Any = None  # supertonic.loader
        self._folder: Path | None = None  # the model folder setup resolved
        self._style: Any = None
        self._warned_languages: set[str] = set()
        self._warned_characters: set[str] = set()

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        if kwargs["model"] is not None and (error := model_error(kwargs["model"], kwargs["voice"], context)):
            raise error

    def setup(self) -> None:
        onnxruntime = require("onnxruntime", backend="tts=supertonic", extra=None)
        supertonic = require("supertonic", backend="tts=supertonic", extra="supertonic")
        self._loader = loader = supertonic.loader
        self._folder = self._model_folder(supertonic)
        # in the order the engine takes them: duration predictor, text encoder, vector estimator, vocoder
        sessions = [cpu_session(onnxruntime, self._folder / path, self.threads)
                    for path in loader.get_all_onnx_module_relative_paths()]
        self._engine = supertonic.core.Supertonic(loader.load_configs(self._folder),
                                                  loader.load_text_processor(self._folder), *sessions)
        self.sample_rate = int(self._engine.sample_rate)
        self.settings_changed({"voice"})

    def _model_folder(self, supertonic: Any) -> Path:
        """The configured folder, or Supertonic-3 in the cache, downloaded by the package the first time."""
        if self.model is not None:
            return Path(self.model).expanduser()
        revision = supertonic.config.get_model_revision(MODEL_NAME)
        target = cache_root(self.cache_dir) / "supertonic" / f"{MODEL_NAME}-{revision[:12]}"
        import huggingface_hub

        if not target.exists() and huggingface_hub.is_offline_mode():
            raise RuntimeError(
                f"tts=supertonic: Supertonic-3 is not in {target} and HF_HUB_OFFLINE=1 forbids downloading it; run "
                f"once online (the supertonic package downloads {HUB_REPO} at {revision[:12]}, about 400 MB, into "
                f"that folder), or set tts.model to a folder holding it (the package's own: ~/.cache/supertonic3)")
        return build_once(target, lambda out: supertonic.loader.download_model(out, MODEL_NAME),
                          f"Supertonic-3 ({HUB_REPO} at {revision[:12]}, about 400 MB)")

    def settings_changed(self, keys: set[str]) -> None:
        if "voice" in keys:
            self._style = self._loader.load_voice_style_from_name(self._folder, self.voice)

    def turn_language(self, language: str | None) -> str:
        """The code a turn is spoken with: its own when Supertonic has it, else ``language`` (warned once)."""
        if not language:
            return self.language
        if (code := turn_code(language)) in LANGUAGES:
            return code
        if language not in self._warned_languages:
            self._warned_languages.add(language)
            log.warning("tts=supertonic has no language %r; such turns are spoken with language=%s",
                        language, self.language)
        return self.language

    def speakable(self, sentence: str) -> str:
        """``sentence`` without the characters the model has no id for (the package would refuse the text)."""
        _, unsupported = self._engine.text_processor.validate_text(sentence)
        if not unsupported:
            return sentence
        if new := set(unsupported) - self._warned_characters:
            self._warned_characters |= new
            log.warning("tts=supertonic: the model has no characters %s; they are left out", "".join(sorted(new)))
        return "".join(character for character in sentence if character not in unsupported)

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        code = self.turn_language(language)
        splitter = SentenceSplitter(min_chars=1)
        for sentence in [*splitter.feed(text), *splitter.finish()]:
            sentence = self.speakable(sentence)
            if not has_words(sentence):
                continue  # punctuation alone ("...") would be a model call for a click
            wav, duration = self._engine([sentence], self._style, self.total_steps, self.speed, code)
            # the vocoder pads to whole latent frames; the predicted duration is where the speech ends
            yield wav[0, :int(duration[0] * self.sample_rate)]

    def close(self) -> None:
        self._engine = None
        self._style = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model or f"{MODEL_NAME} (downloaded once)", "voice": self.voice,
                "language": self.language, "total_steps": self.total_steps, "device": "cpu"}

"""Meta MMS-TTS (VITS, one model per language: facebook/mms-tts-<iso639-3>) through transformers."""
from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Annotated, Any

from s2s import torch_support
from s2s.config_errors import ConfigErrors, Range, ValidationContext
from s2s.models import loadable, model_folder_error
from s2s.stage import require
from s2s.text import SentenceSplitter
from s2s.tts.base import TTSStage

log = logging.getLogger(__name__)
HUB_TEMPLATE = "facebook/mms-tts-{code}"
# Whisper's ISO 639-1 codes (what STT reports per turn) -> the ISO 639-3 code of the MMS checkpoint.
LANGUAGES = {
    "en": "eng", "fr": "fra", "es": "spa", "ko": "kor", "hi": "hin", "ar": "ara", "hy": "hyw", "az": "azb",
    "bg": "bul", "ca": "cat", "nl": "nld", "fi": "fin", "de": "deu", "el": "ell", "he": "heb", "hu": "hun",
    "is": "isl", "id": "ind", "kn": "kan", "kk": "kaz", "lv": "lav", "ms": "zlm", "mr": "mar", "fa": "fas",
    "pl": "pol", "pt": "por", "ro": "ron", "ru": "rus", "sw": "swh", "sv": "swe", "tl": "tgl", "ta": "tam",
    "th": "tha", "tr": "tur", "uk": "ukr", "ur": "urd", "vi": "vie", "cy": "cym",
}
# VITS renders a whole input at once; past this length a sentence is cut at clause marks so the first audio
# of a long sentence does not wait for all of it.
CLAUSE_CHARS = 160
_CLAUSE = re.compile(r"(?<=[,;:，；：])\s+")


def split_for_speech(text: str) -> list[str]:
    """Sentences, with long ones cut at commas/semicolons/colons into pieces of about ``CLAUSE_CHARS``."""
    splitter = SentenceSplitter(min_chars=1)
    pieces: list[str] = []
    for sentence in [*splitter.feed(text), *splitter.finish()]:
        if len(sentence) <= CLAUSE_CHARS:
            pieces.append(sentence)
            continue
        current = ""
        for clause in _CLAUSE.split(sentence):
            if current and len(current) + 1 + len(clause) > CLAUSE_CHARS:
                pieces.append(current)
                current = clause
            else:
                current = f"{current} {clause}" if current else clause
        if current:
            pieces.append(current)
    return pieces


class MmsTTS(TTSStage):
    """MMS-TTS: a small VITS model per language; not streaming, so it yields one block per sentence or clause.

    Args:
        language: ISO 639-1 code of the voice (en, fr, es, ...: the 38 codes of ``LANGUAGES``, or a key of
            ``models``). A turn in another language (``ReplyText.language``, from STT) loads that language's
            model once and keeps it; a language with no model falls back to this one, with a warning.
        model: the model for ``language``: a local folder or hub id; null -> ``facebook/mms-tts-<iso639-3>``.
        models: per-language models for turns in other languages, ``{fr: /models/mms-fra, yo: facebook/mms-tts-yor}``;
            overrides the hub default and adds languages beyond the built-in list.
        device: auto, cpu, cuda, cuda:N or mps.
        speaking_rate: >1 speaks faster; null keeps the checkpoint's value (1.0 for MMS).
        noise_scale: sampling noise (expressiveness vs stability); null keeps the checkpoint's (0.667 for MMS).
    """

    speed_key = "speaking_rate"
    runtime_keys = frozenset({"speaking_rate"})  # an attribute each loaded VitsModel reads per call

    def __init__(self, language: str = "en", model: str | None = None, models: dict[str, str] | None = None,
                 device: str = "auto", speaking_rate: Annotated[float, Range(0.25, 4)] | None = None,
                 noise_scale: Annotated[float, Range(0, 2)] | None = None) -> None:
        self.language = language
        self.model = model
        self.models = dict(models or {})
        self.device = device
        self.speaking_rate = speaking_rate
        self.noise_scale = noise_scale
        self._loaded: dict[str, tuple[Any, Any]] = {}  # model name -> (VitsModel, tokenizer)
        self._checkpoint_rates: dict[str, float] = {}  # model name -> its config's speaking_rate
        self._unavailable: dict[str, str] = {}  # language -> why it falls back (warned once)

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        errors = []
        language = kwargs["language"]
        models = kwargs["models"] or {}
        if language not in LANGUAGES and language not in models:
            errors.append(context.error("language", language, "a code with an MMS model: "
                                        + ", ".join(sorted({*LANGUAGES, *models}))
                                        + " (or add one under models)"))
        if kwargs["model"] is not None and language in models:
            errors.append(context.error("model", kwargs["model"], f"null when models.{language} is set "
                                        "(both name the model of the configured language)"))
        for code, name in models.items():
            if not isinstance(name, str) or not name:
                errors.append(context.error(f"models.{code}", name, "a local folder or a hub id"))
            elif error := model_folder_error(name, context, "facebook/mms-tts-fra", key=f"models.{code}"):
                errors.append(error)
        if error := model_folder_error(kwargs["model"], context, "facebook/mms-tts-eng"):
            errors.append(error)
        if errors:
            raise ConfigErrors(errors)

    def model_for(self, language: str) -> str | None:
        """The model that speaks ``language``, or None when there is none."""
        if language == self.language and self.model is not None:
            return self.model
        if language in self.models:
            return self.models[language]
        if language in LANGUAGES:
            return HUB_TEMPLATE.format(code=LANGUAGES[language])
        return None

    def _load(self, name: str) -> tuple[Any, Any]:
        if name not in self._loaded:
            transformers = require("transformers", backend="tts=mms", extra="mms")
            path = loadable(name)
            log.info("MMS-TTS: loading %s", path)
            overrides = {} if self.noise_scale is None else {"noise_scale": self.noise_scale}
            model = transformers.VitsModel.from_pretrained(path, **overrides).to(self.device).eval()
            self._checkpoint_rates[name] = model.speaking_rate
            self._loaded[name] = (model, transformers.AutoTokenizer.from_pretrained(path))
            self._set_rate(name)
        return self._loaded[name]

    def _set_rate(self, name: str) -> None:
        rate = self._checkpoint_rates[name] if self.speaking_rate is None else self.speaking_rate
        self._loaded[name][0].speaking_rate = rate

    def settings_changed(self, keys: set[str]) -> None:
        for name in self._loaded:
            self._set_rate(name)

    def setup(self) -> None:
        self.device = torch_support.usable_device(self.device)
        torch_support.repair_torchaudio()  # transformers imports torchaudio whenever it is installed
        model, _ = self._load(self.model_for(self.language))  # type: ignore[arg-type] - validated
        self.sample_rate = model.config.sampling_rate

    def _for_turn(self, language: str | None) -> tuple[Any, Any]:
        """The model of this turn's language, or the configured one (warning once per language)."""
        language = (language or self.language).lower()
        if language in self._unavailable:
            return self._load(self.model_for(self.language))  # type: ignore[arg-type]
        name = self.model_for(language) or self.model_for(language.split("-")[0].split("_")[0])
        if name is None:
            self._unavailable[language] = "no MMS model is known for it (add one under tts.models)"
        else:
            try:
                return self._load(name)
            except OSError as error:  # missing folder, or a hub id that is neither cached nor reachable
                self._unavailable[language] = f"{name} could not be loaded ({error})"
        log.warning("MMS-TTS: language %r: %s; speaking it with the %r model instead",
                    language, self._unavailable[language], self.language)
        return self._load(self.model_for(self.language))  # type: ignore[arg-type]

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        import torch

        model, tokenizer = self._for_turn(language)
        self.sample_rate = model.config.sampling_rate
        for piece in split_for_speech(text):
            inputs = tokenizer(piece, return_tensors="pt")
            if inputs["input_ids"].shape[-1] == 0:  # nothing the model's alphabet can say
                continue
            with torch.inference_mode():
                waveform = model(**inputs.to(self.device)).waveform
            yield waveform[0]

    def close(self) -> None:
        self._loaded.clear()
        self._checkpoint_rates.clear()

    def describe(self) -> dict[str, Any]:
        details: dict[str, Any] = {"language": self.language, "model": self.model_for(self.language)}
        if self.models:
            details["models"] = ",".join(f"{code}:{name}" for code, name in self.models.items())
        return details

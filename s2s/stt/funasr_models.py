"""FunASR's speech models, SenseVoiceSmall and Paraformer, through ``funasr.AutoModel``: the reference's runtime.

Why funasr and not an ONNX runtime: it is MIT and installs beside this project's packages without changing one
(torch is already here); it loads the published checkpoints as they are (``FunAudioLLM/SenseVoiceSmall``,
``funasr/paraformer-zh``, or a local folder with ``config.yaml`` + ``model.pt``), while sherpa-onnx needs its own
ONNX exports and funasr-onnx pins an older numpy; and its model classes build a tiny model in a test, so the
tests run the library's real front end, encoder, decoding and tokenizer. Its cost is the import (about 10 s of
CPU: it imports every model it knows).

SenseVoice writes what it identified before the words, as tags: ``<|en|><|NEUTRAL|><|Speech|><|withitn|>Hello.``
(language, emotion, audio event, text normalisation). The tags never reach the transcript; the language travels
on it, as every STT stage's does.

Neither stage declares ``requires``: funasr runs wherever torch does, which is every platform s2s knows.
"""
from __future__ import annotations

import logging
import os
import re
from typing import Annotated, Any, ClassVar, Literal

from s2s import torch_support
from s2s.config_errors import OneOf, ValidationContext
from s2s.languages import WHISPER_LANGUAGES
from s2s.models import loadable, local_path, model_folder_error
from s2s.stage import require
from s2s.stt.base import STTStage

log = logging.getLogger(__name__)

SENSE_VOICE_LANGUAGES = ("zh", "en", "yue", "ja", "ko")  # the languages SenseVoiceSmall can be told or reports
# FunASR's own names for its published Paraformers, with the language each writes (funasr maps the names to repos)
PARAFORMER_LANGUAGES = {"paraformer-zh": "zh", "paraformer": "zh", "paraformer-en": "en"}
_TAG = re.compile(r"<\|([^|<>]*)\|>")


def split_tags(text: str) -> tuple[str, list[str]]:
    """``<|en|><|NEUTRAL|><|Speech|><|withitn|> Hello.`` -> ``("Hello.", ["en", "NEUTRAL", "Speech", "withitn"])``:
    the words without SenseVoice's tags (wherever they are), and the tags in order."""
    return " ".join(_TAG.sub(" ", text).split()), _TAG.findall(text)


def _auto_model(backend: str, extra: str) -> Any:
    """funasr's ``AutoModel``, imported after the torchaudio repair (funasr imports torchaudio). Importing funasr
    sets ``HYDRA_FULL_ERROR=1`` for the whole process (and so for every command a test starts after it); the
    variable is put back as it was."""
    torch_support.repair_torchaudio()
    before = os.environ.get("HYDRA_FULL_ERROR")
    try:
        funasr = require("funasr", backend=backend, extra=extra)
    finally:
        if before is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = before
    return funasr.AutoModel


class FunASRSTT(STTStage):
    """What the two FunASR stages share: the model check, the load, one ``generate`` per utterance."""

    option: ClassVar[str]  # the option as a user writes it, for errors
    extra: ClassVar[str]  # the pip extra that installs funasr
    example: ClassVar[str]  # a hub id that validation offers instead of a missing folder
    model_name: str
    hub: str
    device: str
    _model: Any = None

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        if error := model_folder_error(kwargs["model"], context, cls.example, needs=("config.yaml", "model.pt")):
            raise error

    def setup(self) -> None:
        auto_model = _auto_model(self.option, self.extra)
        import torch

        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        try:  # ncpu: AutoModel sets torch's thread count for the whole process; kept unless runner.threads says
            self._model = auto_model(model=loadable(self.model_name), hub=self.hub,
                                     device=torch_support.usable_device(self.device),
                                     ncpu=self.threads or torch.get_num_threads(), disable_update=True,
                                     disable_pbar=True, disable_log=True, log_level=level)
        except RuntimeError as error:
            if local_path(self.model_name) is not None or "is not registered" not in str(error):
                raise
            # funasr prints the failed download and then reports every model class it knows: say what happened
            raise RuntimeError(f"{self.option}: {self.model_name} is not in the local cache of hub {self.hub} and "
                               "could not be downloaded (offline?); download it once, or set stt.model to a "
                               "local folder with config.yaml and model.pt") from None

    def _generate(self, samples: Any, **options: Any) -> str:
        """The raw text FunASR writes for one utterance ("" when it finds no token)."""
        import numpy as np

        results = self._model.generate(np.asarray(samples, dtype=np.float32), cache={}, **options)
        return str(results[0].get("text", "")) if results else ""

    def close(self) -> None:
        self._model = None

    def describe(self) -> dict[str, Any]:
        source = self.model_name if local_path(self.model_name) else f"{self.model_name} ({self.hub})"
        return {"model": source, "device": self.device, "language": self.language or "detect"}


class SenseVoiceSTT(FunASRSTT):
    """Transcribes each utterance with SenseVoiceSmall (Chinese, English, Cantonese, Japanese, Korean), which
    identifies the language itself.

    Args:
        model: a hub id (``FunAudioLLM/SenseVoiceSmall`` on hf, ``iic/SenseVoiceSmall`` on ms) or a local folder
            with ``config.yaml`` and ``model.pt`` (and the tokenizer and ``am.mvn`` the config names).
        hub: where a hub id is found: hf (Hugging Face; offline runs read its local cache) or ms (ModelScope).
        device: auto, cpu, cuda, cuda:N or mps.
        language: zh, en, yue, ja or ko to tell the model; null: it identifies the language, and the transcript
            carries what it identified. A realtime session's language outside these five is identified too.
        use_itn: punctuation and inverse text normalisation ("twenty one" -> "21"), as the reference runs it.
    """

    option, extra, example = "stt=sense_voice", "sense-voice", "FunAudioLLM/SenseVoiceSmall"

    def __init__(self, model: str = "FunAudioLLM/SenseVoiceSmall", hub: Literal["hf", "ms"] = "hf",
                 device: str = "auto", language: Annotated[str, OneOf(SENSE_VOICE_LANGUAGES)] | None = None,
                 use_itn: bool = True) -> None:
        self.model_name = model
        self.hub = hub
        self.device = device
        self.language = language
        self.use_itn = use_itn

    def transcribe(self, samples: Any) -> tuple[str, str | None]:
        told = self.language if self.language in SENSE_VOICE_LANGUAGES else "auto"
        text, tags = split_tags(self._generate(samples, language=told, use_itn=self.use_itn))
        heard = next((tag for tag in tags if tag in SENSE_VOICE_LANGUAGES), None)
        if tags:
            log.debug("SenseVoice tags: %s", ", ".join(tags))
        return text, heard or (told if told != "auto" else None)


class ParaformerSTT(FunASRSTT):
    """Transcribes each utterance with a Paraformer (non-autoregressive; ``paraformer-zh`` is Chinese with some
    English, ``paraformer-en`` English).

    Args:
        model: FunASR's name of a published Paraformer (``paraformer-zh``, ``paraformer-en``), a hub id or a
            local folder with ``config.yaml`` and ``model.pt`` (and ``tokens.json`` or the tokenizer its config
            names).
        hub: where a name or hub id is found: hf (Hugging Face; offline runs read its local cache) or ms.
        device: auto, cpu, cuda, cuda:N or mps.
        language: the language the transcript is labelled with (Paraformer reports none); null: the published
            model's own (zh for paraformer-zh, en for paraformer-en), unknown for any other model.
    """

    option, extra, example = "stt=paraformer", "paraformer", "paraformer-zh"

    def __init__(self, model: str = "paraformer-zh", hub: Literal["hf", "ms"] = "hf", device: str = "auto",
                 language: Annotated[str, OneOf(WHISPER_LANGUAGES)] | None = None) -> None:
        self.model_name = model
        self.hub = hub
        self.device = device
        self.language = language

    def transcribe(self, samples: Any) -> tuple[str, str | None]:
        # FunASR already joins Chinese characters without spaces and English words with them
        return self._generate(samples).strip(), self.language or PARAFORMER_LANGUAGES.get(self.model_name)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "language": self.language or PARAFORMER_LANGUAGES.get(self.model_name, "unknown")}

"""Qwen3-ASR through transformers' own ``qwen3_asr`` model: 30 languages identified per turn, hotword context."""
from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from s2s import torch_support
from s2s.config_errors import OneOf, Range, ValidationContext
from s2s.models import loadable, model_folder_error
from s2s.sharing import shared_model
from s2s.stage import require
from s2s.stt.base import STTStage

log = logging.getLogger(__name__)

# The codes Qwen3-ASR's processor accepts (transformers' LANGUAGE_CODE_TO_NAME, stated here so validation needs
# no transformers import; tests/test_stt_qwen3_asr.py holds the two equal).
LANGUAGES = ("ar", "yue", "zh", "cs", "da", "nl", "en", "fil", "fi", "fr", "de", "el", "hi", "hu", "id", "it", "ja",
             "ko", "mk", "ms", "fa", "pl", "pt", "ro", "ru", "es", "sv", "th", "tr", "vi")


class Qwen3ASRSTT(STTStage):
    """Transcribes each utterance with a Qwen3-ASR checkpoint (``Qwen3ASRForConditionalGeneration``).

    The model writes ``language <Name><asr_text><text>``: without a configured language it names the language of
    every turn itself, and the transcript carries that code, so the LLM answers in it and a language-switching TTS
    speaks it. A configured language is prefilled instead (the processor's forced language), so the model writes
    only the text.

    Args:
        model: a hub id in transformers' layout (``Qwen/Qwen3-ASR-0.6B-hf``, ``Qwen/Qwen3-ASR-1.7B-hf``) or a local
            folder.
        device: auto, cpu, cuda, cuda:N or mps.
        dtype: auto picks bfloat16 on GPUs that have it (else float16) and float32 on CPU.
        language: a code of :data:`LANGUAGES`, or null to identify the language of each turn.
        context: words or text that bias the transcription toward them (names, jargon): a list of hotwords or one
            string; the processor puts it in the model's system turn. Null: none.
        max_new_tokens: cap on tokens per utterance (the language prefix takes about four).
    """

    def __init__(self, model: str = "Qwen/Qwen3-ASR-0.6B-hf", device: str = "auto",
                 dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto",
                 language: Annotated[str, OneOf(LANGUAGES)] | None = None,
                 context: str | list[str] | None = None,
                 max_new_tokens: Annotated[int, Range(1, 4096)] = 256) -> None:
        self.model_name = model
        self.device = device
        self.dtype = dtype
        self.language = language
        self.context = ", ".join(context) if isinstance(context, (list, tuple)) else (context or None)
        self.max_new_tokens = max_new_tokens
        self._model: Any = None
        self._processor: Any = None
        self._codes: dict[str, str] = {}  # the language names the model writes -> their codes

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        hotwords = kwargs["context"]
        if isinstance(hotwords, list) and not all(isinstance(word, str) and word.strip() for word in hotwords):
            raise context.error("context", hotwords, "a list of non-empty words, one string, or null")
        if error := model_folder_error(kwargs["model"], context, "Qwen/Qwen3-ASR-0.6B-hf", needs=("config.json",)):
            raise error

    def setup(self) -> None:
        self.device = torch_support.usable_device(self.device)
        torch_support.repair_torchaudio()
        transformers = require("transformers", backend="stt=qwen3_asr", extra=None)
        if self.threads:  # torch has one intra-op pool per process: the budget holds for every torch stage
            import torch

            torch.set_num_threads(self.threads)
        from transformers.models.qwen3_asr.processing_qwen3_asr import LANGUAGE_CODE_TO_NAME

        self._codes = {name.lower(): code for code, name in LANGUAGE_CODE_TO_NAME.items()}
        path = loadable(self.model_name)
        dtype = torch_support.torch_dtype(self.dtype, self.device)
        self._processor = transformers.AutoProcessor.from_pretrained(path)
        self._model = shared_model(  # one copy per process when the realtime server shares weights
            ("qwen3_asr", path, str(dtype), self.device),
            lambda: transformers.AutoModelForMultimodalLM.from_pretrained(path, dtype=dtype).to(self.device).eval())

    def inputs(self, samples: Any) -> Any:
        """What the model reads for one utterance: the processor's prompt (context, audio, forced language)."""
        return self._processor.apply_transcription_request(audio=samples, language=self.language,
                                                           prompt=self.context).to(self.device, self._model.dtype)

    def transcribe(self, samples: Any) -> tuple[str, str | None]:
        import torch

        inputs = self.inputs(samples)
        with torch.inference_mode():
            ids = self._model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False)
        said = self._processor.decode(ids[0, inputs["input_ids"].shape[1]:], return_format="parsed")
        return said["transcription"], self.language or self.language_code(said["language"])

    def language_code(self, name: str | None) -> str | None:
        """The code of a language the model named (``English`` -> ``en``); None when it named none it supports."""
        code = self._codes.get((name or "").strip().lower())
        if name and code is None and name.strip().lower() != "none":
            log.warning("Qwen3-ASR named a language it does not support: %r; the turn's language is unknown", name)
        return code

    def close(self) -> None:
        self._model = self._processor = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_name, "device": self.device, "language": self.language or "detect",
                "context": self.context}

"""Whisper through transformers (any size, fine-tunes, distil-whisper); a hub id or a local folder."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from s2s import torch_support
from s2s.config_errors import OneOf, Range, ValidationContext
from s2s.models import loadable, model_folder_error
from s2s.stage import require
from s2s.stt.base import STTStage
from s2s.languages import WHISPER_LANGUAGES


class WhisperSTT(STTStage):
    """Transcribes each utterance with transformers' ``WhisperForConditionalGeneration``.

    Args:
        model: a hub id (``openai/whisper-small``, ``distil-whisper/distil-large-v3``) or a local folder.
        device: auto, cpu, cuda, cuda:N or mps.
        dtype: auto picks float16 on GPUs and float32 on CPU.
        language: language code, or null to detect it per turn (multilingual models); the transcript carries
            the language either way.
        max_new_tokens: cap on tokens per utterance.
        num_beams: 1 is greedy and fastest.
    """

    def __init__(self, model: str = "openai/whisper-tiny", device: str = "auto",
                 dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto",
                 language: Annotated[str, OneOf(WHISPER_LANGUAGES)] | None = None,
                 max_new_tokens: Annotated[int, Range(1, 440)] = 128,
                 num_beams: Annotated[int, Range(1, 20)] = 1) -> None:
        self.model_name = model
        self.device = device
        self.dtype = dtype
        self.language = language
        self.max_new_tokens = max_new_tokens
        self.num_beams = num_beams
        self._model: Any = None
        self._processor: Any = None

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        if error := model_folder_error(kwargs["model"], context, "openai/whisper-small"):
            raise error

    def setup(self) -> None:
        torch_support.repair_torchaudio()
        transformers = require("transformers", backend="stt=whisper", extra=None)
        path = loadable(self.model_name)
        dtype = torch_support.torch_dtype("float16" if self.dtype == "auto" and self.device != "cpu" else self.dtype,
                                          self.device)
        self._processor = transformers.AutoProcessor.from_pretrained(path)
        self._model = transformers.WhisperForConditionalGeneration.from_pretrained(path, dtype=dtype)
        self._model = self._model.to(self.device).eval()
        self._multilingual = bool(getattr(self._model.generation_config, "is_multilingual", False))

    def _features(self, samples: Any) -> Any:
        # the extractor refuses a rate other than its own: a checkpoint that is not 16 kHz fails loudly here
        features = self._processor.feature_extractor(samples, sampling_rate=self.sample_rate, return_tensors="pt")
        return features.input_features.to(self.device, self._model.dtype)

    def transcribe(self, samples: Any) -> tuple[str, str | None]:
        import torch

        features = self._features(samples)
        options: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "num_beams": self.num_beams}
        language = self.language
        with torch.inference_mode():
            if self._multilingual:
                if language is None:  # one decoder step over the language tokens, as generate() would do itself
                    token = self._model.detect_language(features)[0].item()
                    language = self._processor.tokenizer.convert_ids_to_tokens(token).strip("<|>")
                options.update(language=language, task="transcribe")
            ids = self._model.generate(features, **options)
        text = self._processor.batch_decode(ids, skip_special_tokens=True)[0].strip()
        return text, language or "en"  # English-only checkpoints (*.en) speak English

    def close(self) -> None:
        self._model = self._processor = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_name, "device": self.device, "language": self.language or "detect"}

"""Whisper on MLX through mlx-whisper (Metal on Apple silicon; ``mlx[cpu]`` elsewhere)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from s2s.config_errors import OneOf, ValidationContext
from s2s.models import loadable, model_folder_error
from s2s.runtimes import Runtime
from s2s.stage import require
from s2s.stt.base import STTStage
from s2s.languages import WHISPER_LANGUAGES


class MLXWhisperSTT(STTStage):
    """Transcribes each utterance with ``mlx_whisper.transcribe`` (greedy, no temperature fallback).

    Args:
        model: an MLX Whisper hub id (``mlx-community/whisper-large-v3-turbo``) or a local folder with
            ``config.json`` and ``weights.safetensors`` / ``weights.npz``.
        dtype: float16 (Apple silicon's fast path) or float32.
        language: language code, or null to detect it per turn; the transcript carries the language.
    """

    requires = Runtime("mlx", option="mlx_whisper", instead="stt=faster_whisper")

    def __init__(self, model: str = "mlx-community/whisper-large-v3-turbo",
                 dtype: Literal["float16", "float32"] = "float16",
                 language: Annotated[str, OneOf(WHISPER_LANGUAGES)] | None = None) -> None:
        self.model_name = model
        self.dtype = dtype
        self.language = language
        self._mlx_transcribe: Any = None
        self._path = model

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        if error := model_folder_error(kwargs["model"], context, "mlx-community/whisper-large-v3-turbo"):
            raise error

    def setup(self) -> None:
        mlx_whisper = require("mlx_whisper", backend="stt=mlx_whisper", extra="mlx")
        import mlx.core as mx
        from mlx_whisper.transcribe import ModelHolder

        self._path = loadable(self.model_name)
        ModelHolder.get_model(self._path, getattr(mx, self.dtype))  # load now, not on the first turn
        self._mlx_transcribe = mlx_whisper.transcribe

    def transcribe(self, samples: Any) -> tuple[str, str | None]:
        result = self._mlx_transcribe(samples, path_or_hf_repo=self._path, language=self.language, temperature=0.0,
                                  condition_on_previous_text=False, fp16=self.dtype == "float16", verbose=None)
        return str(result.get("text", "")).strip(), self.language or result.get("language")

    def close(self) -> None:
        self._mlx_transcribe = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_name, "device": "mlx (Metal on Apple silicon, else CPU)",
                "language": self.language or "detect"}

"""NVIDIA Parakeet TDT: onnx-asr (onnxruntime, any OS) or parakeet-mlx (Apple silicon), chosen per platform."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from s2s.config_errors import OneOf, ValidationContext
from s2s.models import local_path, model_folder_error
from s2s.runtimes import ByBackend, Runtime
from s2s.stage import require
from s2s.stt.base import STTStage
from s2s.languages import WHISPER_LANGUAGES

# Published checkpoints by name: onnx-asr's model names (istupakov's ONNX exports) and mlx-community's repos.
MODELS = {
    "parakeet-tdt-0.6b-v2": {"onnx": "nemo-parakeet-tdt-0.6b-v2", "mlx": "mlx-community/parakeet-tdt-0.6b-v2"},
    "parakeet-tdt-0.6b-v3": {"onnx": "nemo-parakeet-tdt-0.6b-v3", "mlx": "mlx-community/parakeet-tdt-0.6b-v3"},
}


class ParakeetSTT(STTStage):
    """Transcribes each utterance with Parakeet TDT (English v2, 25 European languages v3).

    Args:
        model: ``parakeet-tdt-0.6b-v2`` or ``parakeet-tdt-0.6b-v3`` (each backend's published copy), a local
            folder in the backend's layout (onnx-asr: ``encoder-model.onnx``, ``decoder_joint-model.onnx``,
            ``vocab.txt``; mlx: ``config.json``, ``model.safetensors``) or a hub id of the backend.
        backend: ``onnx`` (onnx-asr on onnxruntime) or ``mlx`` (parakeet-mlx); Apple silicon picks mlx.
        quantization: onnx only: null (float32) or int8 (the ``*.int8.onnx`` files).
        language: the language the transcript is labelled with (Parakeet does not report one); null leaves it
            unknown, so a language-switching TTS keeps its own.
    """

    requires = ByBackend({"onnx": Runtime("onnxruntime"), "mlx": Runtime("mlx")})

    def __init__(self, model: str = "parakeet-tdt-0.6b-v2", backend: Literal["onnx", "mlx"] = "onnx",
                 quantization: Literal["int8"] | None = None,
                 language: Annotated[str, OneOf(WHISPER_LANGUAGES)] | None = "en") -> None:
        self.model_name = model
        self.backend = backend
        self.quantization = quantization
        self.language = language
        self._model: Any = None

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        if kwargs["backend"] == "mlx" and kwargs["quantization"] is not None:
            raise context.error("quantization", kwargs["quantization"],
                                "null with backend=mlx (quantized MLX checkpoints are separate repos: set stt.model)")
        if error := model_folder_error(kwargs["model"], context, "parakeet-tdt-0.6b-v3"):
            raise error

    def _source(self) -> tuple[str, bool]:
        """What the backend loads, and whether it is a local folder."""
        if (path := local_path(self.model_name)) is not None:
            return str(path), True
        return MODELS.get(self.model_name, {}).get(self.backend, self.model_name), False

    def setup(self) -> None:
        source, local = self._source()
        if self.backend == "mlx":
            parakeet_mlx = require("parakeet_mlx", backend="stt=parakeet (backend=mlx)", extra="parakeet")
            import mlx.core as mx

            self._model = parakeet_mlx.from_pretrained(source, dtype=mx.bfloat16)
        else:
            onnx_asr = require("onnx_asr", backend="stt=parakeet (backend=onnx)", extra="parakeet")
            kind = "nemo-conformer-tdt" if local else source  # a folder: its files say the rest
            self._model = onnx_asr.load_model(kind, source if local else None, quantization=self.quantization)

    def transcribe(self, samples: Any) -> tuple[str, str | None]:
        """The text, labelled with ``language`` (Parakeet reports none)."""
        if self.backend == "mlx":
            import mlx.core as mx
            from parakeet_mlx.audio import get_logmel

            mel = get_logmel(mx.array(samples), self._model.preprocessor_config)
            return self._model.generate(mel)[0].text.strip(), self.language
        return str(self._model.recognize(samples, sample_rate=self.sample_rate)).strip(), self.language

    def close(self) -> None:
        self._model = None

    def describe(self) -> dict[str, Any]:
        return {"model": self._source()[0], "backend": self.backend,
                "device": "mlx (Metal)" if self.backend == "mlx" else "cpu (onnxruntime)"}

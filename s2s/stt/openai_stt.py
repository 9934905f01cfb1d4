"""Speech recognition by any server with OpenAI's ``/v1/audio/transcriptions`` (OpenAI, vLLM, speaches,
transformers serve, ...) through the ``openai`` package."""
from __future__ import annotations

from typing import Annotated, Any

from s2s import audio
from s2s.config_errors import OneOf, Range, ValidationContext
from s2s.openai_api import cause, check_base_url, connect, detail
from s2s.stage import require
from s2s.stt.base import STTStage, TranscriptionFailed
from s2s.languages import WHISPER_LANGUAGES


class OpenAISTT(STTStage):
    """Sends each utterance as a 16 kHz WAV to ``POST {base_url}/audio/transcriptions``.

    Args:
        model: the transcription model the server knows (``whisper-1``, ``gpt-4o-mini-transcribe``, a local name).
        base_url: the server's API root, e.g. ``http://127.0.0.1:8000/v1``.
        api_key: sent as a bearer token; null sends a placeholder (local servers need none).
        language: language code sent with each request, or null to let the server detect it (the language
            reaches the transcript where the server reports it).
        timeout_s: how long one request may take before the turn is dropped with an error.
    """

    on_cores = False  # it waits on the network: never in a server's turn order

    def __init__(self, model: str = "whisper-1", base_url: str = "https://api.openai.com/v1",
                 api_key: str | None = None, language: Annotated[str, OneOf(WHISPER_LANGUAGES)] | None = "en",
                 timeout_s: Annotated[float, Range(0, exclusive=True)] = 30.0) -> None:
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.language = language
        self.timeout_s = timeout_s
        self._client: Any = None
        self._openai: Any = None

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        check_base_url(kwargs["base_url"], context)

    def setup(self) -> None:
        self._openai = require("openai", backend="stt=openai", extra="openai")
        self._client, served = connect(self._openai, self.base_url, self.api_key, self.timeout_s, "stt")
        if self.model in served:
            return
        try:  # not listed (many servers list only some models): a short silence says whether it is served
            self._request(audio.silence(0.5, self.sample_rate))
        except self._openai.APIConnectionError as error:
            raise RuntimeError(f"stt=openai at {self.base_url}: the server stopped answering ({error})") from None
        except self._openai.APIStatusError as error:
            listed = f" (it lists: {', '.join(served[:10])})" if served else ""
            raise RuntimeError(f"stt=openai at {self.base_url}: model {self.model!r} is not served: HTTP "
                               f"{error.status_code}: {detail(error)}{listed}; check stt.model") from None

    def warm_up(self) -> None:
        """Nothing: setup already checked that the server serves the model; a throwaway request adds nothing."""

    def transcribe(self, samples: Any) -> tuple[str, str | None]:
        try:
            return self._request(samples)
        except self._openai.APIError as error:  # a transient server failure costs this turn, not the session
            raise TranscriptionFailed(f"stt=openai at {self.base_url} failed: {cause(error)}") from error

    def _request(self, samples: Any) -> tuple[str, str | None]:
        """One ``POST /audio/transcriptions``; the SDK's errors pass through (setup reads them its own way)."""
        options: dict[str, Any] = {"language": self.language} if self.language else {"response_format": "verbose_json"}
        upload = ("speech.wav", audio.wav_bytes(samples, self.sample_rate), "audio/wav")
        result = self._client.audio.transcriptions.create(model=self.model, file=upload, **options)
        language = self.language or language_code(getattr(result, "language", None))
        return (result.text or "").strip(), language

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "base_url": self.base_url, "language": self.language or "detect"}


def language_code(language: str | None) -> str | None:
    """``verbose_json`` names the language ("english"); the pipeline speaks in codes ("en")."""
    if not language:
        return None
    language = language.lower()
    if language in WHISPER_LANGUAGES:
        return language
    from transformers.models.whisper.tokenization_whisper import LANGUAGES  # code -> name, as Whisper spells it

    return next((code for code, name in LANGUAGES.items() if name == language), None)

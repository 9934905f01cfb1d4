"""Speech by any server with OpenAI's ``/v1/audio/speech`` (OpenAI, Kokoro-FastAPI, vLLM-Omni, ...) through the
``openai`` package, streamed as raw PCM while the server makes it."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Annotated, Any

import numpy as np

from s2s.config_errors import Range, ValidationContext
from s2s.openai_api import cause, check_base_url, connect, detail
from s2s.stage import require
from s2s.tts.base import SynthesisFailed, TTSStage

log = logging.getLogger(__name__)
READ_BYTES = 4800  # a read of the stream: 0.1 s of 24 kHz PCM16, so the first audio leaves without waiting
PROBE_TEXT = "Hi."


class OpenAITTS(TTSStage):
    """Sends each reply chunk to ``POST {base_url}/audio/speech`` with ``response_format: pcm`` and yields the
    16-bit mono samples as they arrive; closing the stream (barge-in, cancel) closes the request.

    Args:
        model: the speech model the server knows (``gpt-4o-mini-tts``, ``tts-1``, ``kokoro``, a local name).
        voice: the server's voice name (``alloy``, ``af_heart``, ...).
        base_url: the server's API root, e.g. ``http://127.0.0.1:8880/v1``.
        api_key: sent as a bearer token; null sends a placeholder (local servers need none).
        speed: speaking rate, 0.25-4 (1.0: the voice's own); sent only when not 1.0.
        instructions: how to speak (tone, accent), for models that take it (``gpt-4o-mini-tts``); null sends none.
        sample_rate: the rate of the server's PCM (OpenAI: 24000; raw PCM carries no header to read it from).
        timeout_s: how long the server may take to connect or send the next piece before the chunk is dropped.
    """

    on_cores = False  # it waits on the network: never in a server's turn order

    voice_key = "voice"
    speed_key = "speed"
    runtime_keys = frozenset({"voice", "speed", "instructions"})

    def __init__(self, model: str = "gpt-4o-mini-tts", voice: str = "alloy",
                 base_url: str = "https://api.openai.com/v1", api_key: str | None = None,
                 speed: Annotated[float, Range(0.25, 4)] = 1.0, instructions: str | None = None,
                 sample_rate: Annotated[int, Range(8000, 48000)] = 24000,
                 timeout_s: Annotated[float, Range(0, exclusive=True)] = 30.0) -> None:
        self.model = model
        self.voice = voice
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.speed = speed
        self.instructions = instructions
        self.sample_rate = sample_rate
        self.timeout_s = timeout_s
        self._client: Any = None
        self._openai: Any = None
        self._http: Any = None

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        check_base_url(kwargs["base_url"], context)
        if isinstance(kwargs["voice"], str) and not kwargs["voice"].strip():
            raise context.error("voice", kwargs["voice"], "a voice name the server knows (alloy, af_heart, ...)")

    def setup(self) -> None:
        self._openai = require("openai", backend="tts=openai", extra="openai")
        self._http = require("httpx2", backend="tts=openai", extra="openai")  # the SDK's HTTP library
        self._client, served = connect(self._openai, self.base_url, self.api_key, self.timeout_s, "tts")
        try:  # one short synthesis says whether the model and the voice are served (and warms the server up)
            with self._stream(PROBE_TEXT) as response:
                next(response.iter_bytes(READ_BYTES), None)  # its first piece is enough
        except (self._openai.APIConnectionError, self._http.HTTPError) as error:
            raise RuntimeError(f"tts=openai at {self.base_url}: the server stopped answering ({cause(error)})") \
                from None
        except self._openai.APIStatusError as error:
            listed = f" (it lists: {', '.join(served[:10])})" if served else ""
            raise RuntimeError(f"tts=openai at {self.base_url}: model {self.model!r} with voice {self.voice!r} is "
                               f"not served: HTTP {error.status_code}: {detail(error)}{listed}; check tts.model "
                               f"and tts.voice") from None

    def warm_up(self) -> None:
        """Nothing: setup already made the server speak once."""

    def _stream(self, text: str) -> Any:
        """The streamed ``POST /audio/speech`` (a context manager); the SDK's errors pass through."""
        options: dict[str, Any] = {}
        if self.speed != 1.0:
            options["speed"] = self.speed
        if self.instructions:
            options["instructions"] = self.instructions
        return self._client.audio.speech.with_streaming_response.create(
            model=self.model, voice=self.voice, input=text, response_format="pcm", **options)

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        odd = b""  # a read may end inside a sample: its first byte waits for the next read
        try:
            with self._stream(text) as response:
                for data in response.iter_bytes(READ_BYTES):
                    data = odd + data
                    data, odd = data[:len(data) // 2 * 2], data[len(data) // 2 * 2:]
                    if data:
                        yield np.frombuffer(data, dtype="<i2")
        except self._openai.APIStatusError as error:  # a transient server failure costs this chunk, not the session
            raise SynthesisFailed(f"tts=openai at {self.base_url} answered HTTP {error.status_code}: "
                                  f"{detail(error)}") from error
        except (self._openai.APIError, self._http.HTTPError) as error:  # the stream broke off or stalled mid-way
            raise SynthesisFailed(f"tts=openai at {self.base_url} failed mid-chunk: {cause(error)}") from error

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "voice": self.voice, "base_url": self.base_url,
                "sample_rate": self.sample_rate}

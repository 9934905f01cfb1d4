"""mlx-audio runtime for Qwen3-TTS: Metal on Apple silicon, ``mlx[cpu]`` elsewhere.

Its generators take ``stream=True`` and yield ``GenerationResult`` objects whose ``.audio`` is an ``mx.array``
(``s2s.audio`` converts it); ``is_final_chunk`` is only set on a leftover partial block, so it is not used.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from s2s import torch_support
from s2s.stage import require
from s2s.tts.qwen3.settings import FRAME_RATE, Settings


@dataclass(frozen=True)
class MLXQwen3:
    """A loaded mlx-audio Qwen3-TTS model, streaming one reply at a time.

    Attributes:
        model: the ``mlx_audio`` Qwen3-TTS ``Model`` that ``load_model`` returns.
        settings: the stage's settings (backend ``mlx``), voice included.
    """

    model: Any
    settings: Settings

    @classmethod
    def load(cls, settings: Settings) -> MLXQwen3:
        torch_support.repair_torchaudio()  # mlx_audio imports transformers, which reaches torchaudio when installed
        mx = require("mlx.core", backend="tts=qwen3 (backend mlx)", extra="mlx")
        utils = require("mlx_audio.tts.utils", backend="tts=qwen3 (backend mlx)", extra="mlx")
        if settings.device == "cpu":
            mx.set_default_device(mx.cpu)
        return cls(utils.load_model(settings.mlx_repo), settings)

    def speakers(self) -> list[str]:
        return sorted(str(name).lower() for name in (self.model.get_supported_speakers() or []))

    def stream(self, text: str, language: str) -> Iterator[Any]:
        voice = self.settings.voice
        options = {"max_tokens": self.settings.steps_for(text), "stream": True,
                   # mlx counts int(interval * 12.5) steps; the half step keeps float rounding from losing one
                   "streaming_interval": (self.settings.streaming_chunk_size + 0.5) / FRAME_RATE}
        if voice.mode == "custom_voice":
            results = self.model.generate_custom_voice(text, voice.speaker, language=language,
                                                       instruct=voice.instruct, **options)
        elif voice.mode == "voice_design":
            results = self.model.generate_voice_design(text, voice.instruct, language=language, **options)
        else:  # a Base model clones: ICL with the transcript, the speaker embedding alone without it
            results = self.model.generate(text, ref_audio=voice.ref_audio, lang_code=language,
                                          ref_text=None if voice.xvec_only else voice.ref_text, **options)
        try:
            for result in results:
                yield result.audio
        finally:
            results.close()

"""mlx-audio runtime for Qwen3-TTS: Metal on Apple silicon, ``mlx[cpu]`` elsewhere.

Its generators take ``stream=True`` and yield ``GenerationResult`` objects whose ``.audio`` is an ``mx.array``
(``s2s.audio`` converts it); ``is_final_chunk`` is only set on a leftover partial block, so it is not used.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from s2s import torch_support
from s2s.stage import require

if TYPE_CHECKING:
    from s2s.tts.qwen3 import Qwen3TTS, Voice

FRAME_RATE = 12.5  # codec steps per second of audio


class MLXQwen3:
    """A loaded mlx-audio Qwen3-TTS model, streaming one reply at a time.

    Args:
        model: the ``mlx_audio`` Qwen3-TTS ``Model`` that ``load_model`` returns.
        voice: the voice mode and its values.
        chunk_size: codec steps per streamed block.
        max_new_tokens: cap on codec steps per reply.
    """

    def __init__(self, model: Any, voice: Voice, chunk_size: int, max_new_tokens: int) -> None:
        self.model = model
        self.voice = voice
        self.chunk_size = chunk_size
        self.max_new_tokens = max_new_tokens
        self.sample_rate = int(model.sample_rate)

    @classmethod
    def load(cls, stage: Qwen3TTS) -> MLXQwen3:
        from s2s.tts.qwen3 import mlx_model_id

        torch_support.repair_torchaudio()  # mlx_audio imports transformers, which reaches torchaudio when installed
        mx = require("mlx.core", backend="tts=qwen3 (backend mlx)", extra="mlx")
        utils = require("mlx_audio.tts.utils", backend="tts=qwen3 (backend mlx)", extra="mlx")
        if stage.device == "cpu":
            mx.set_default_device(mx.cpu)
        model = utils.load_model(mlx_model_id(stage.model, stage.quantization))
        return cls(model, stage.voice, stage.args["streaming_chunk_size"], stage.args["max_new_tokens"])

    def speakers(self) -> list[str]:
        return sorted(str(name).lower() for name in (self.model.get_supported_speakers() or []))

    def stream(self, text: str, language: str) -> Iterator[Any]:
        voice = self.voice
        options = {"max_tokens": self.max_new_tokens, "stream": True,
                   # mlx counts int(interval * 12.5) steps; the half step keeps float rounding from losing one
                   "streaming_interval": (self.chunk_size + 0.5) / FRAME_RATE}
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

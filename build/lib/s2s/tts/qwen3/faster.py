"""faster-qwen3-tts runtimes for Qwen3-TTS: backend ggml (qwentts.cpp) and backend torch (CUDA graphs).

Both expose the same streaming generators, ``generate_<mode>_streaming(...)`` yielding
``(float32 samples, 24000, timing)``; neither marks the last block reliably, so the stream simply ends.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from s2s import torch_support
from s2s.config_errors import ConfigError
from s2s.stage import require
from s2s.tts.qwen3.settings import Settings

CPU_REFUSAL = "CUDA graphs require CUDA device"  # faster-qwen3-tts's own message (model.py) for a non-CUDA device


def _load_torch(settings: Settings) -> Any:
    torch_support.repair_torchaudio()  # qwen_tts reaches torchaudio
    faster = require("faster_qwen3_tts", backend="tts=qwen3 (backend torch)", extra="qwen3")
    device = settings.device
    dtype = torch_support.torch_dtype(settings.dtype or "auto", device)
    try:
        model = faster.FasterQwen3TTS.from_pretrained(
            settings.model, device=device, dtype=dtype, backend="torch",
            attn_implementation=settings.attn_implementation,
            # the static KV cache must hold the prompt and every generated step
            max_seq_len=max(2048, settings.max_new_tokens + 512))
    except ValueError as error:
        if CPU_REFUSAL not in str(error):
            raise
        import torch

        have = "no usable CUDA in this torch " + torch.__version__ if device.startswith("cuda") else "not CUDA"
        raise ConfigError("tts.device", device, f"a CUDA device for backend torch ({have}); faster-qwen3-tts "
                          f"runs it on CUDA graphs: use backend ggml or mlx on this machine") from error
    if not settings.parity_mode:  # parity mode clones without the graphs: nothing to capture
        model.warmup()  # captures the CUDA graphs now rather than during the first reply
    return model


def _load_ggml(settings: Settings) -> Any:
    faster = require("faster_qwen3_tts", backend="tts=qwen3 (backend ggml)", extra="qwen3-ggml")
    require("qwentts_cpp", backend="tts=qwen3 (backend ggml)", extra="qwen3-ggml")
    options: dict[str, Any] = {"backend": "ggml", "qwentts_ref_cache_dir": settings.ref_cache_dir}
    if settings.gguf_talker_path:
        options.update(gguf_talker_path=settings.gguf_talker_path, gguf_codec_path=settings.gguf_codec_path)
    else:
        options["quant"] = settings.quantization
    try:
        return faster.FasterQwen3TTS.from_pretrained(settings.model, **options)
    except OSError as error:  # the native library itself cannot load (ctypes)
        raise RuntimeError(f"qwentts.cpp could not load ({error}). PyPI's Linux wheel of qwentts-cpp-python is a "
                           "CUDA 12.8 build needing an NVIDIA driver and the CUDA 12 runtime; without a GPU use "
                           "its CPU build or tts.backend=mlx") from error


@dataclass(frozen=True)
class FasterQwen3:
    """A loaded faster-qwen3-tts model of either backend, streaming one reply at a time.

    Attributes:
        model: ``FasterQwen3TTS`` (torch) or ``GGMLQwen3TTS`` (ggml), as ``from_pretrained`` returns them.
        settings: the stage's settings (backend ``ggml`` or ``torch``), voice included.
    """

    model: Any
    settings: Settings

    @classmethod
    def load(cls, settings: Settings) -> FasterQwen3:
        return cls(_load_torch(settings) if settings.backend == "torch" else _load_ggml(settings), settings)

    def speakers(self) -> list[str]:
        """Lower-case preset voices ([] for Base/VoiceDesign); torch keeps them on the wrapped qwen_tts model."""
        source = self.model.model if self.settings.backend == "torch" else self.model
        return sorted(str(name).lower() for name in (source.get_supported_speakers() or []))

    def stream(self, text: str, language: str) -> Iterator[Any]:
        voice = self.settings.voice
        common = {"text": text, "language": language, "max_new_tokens": self.settings.steps_for(text),
                  "chunk_size": self.settings.streaming_chunk_size,
                  "non_streaming_mode": self.settings.non_streaming_mode}
        if voice.mode == "custom_voice":
            blocks = self.model.generate_custom_voice_streaming(speaker=voice.speaker, instruct=voice.instruct,
                                                                **common)
        elif voice.mode == "voice_design":
            blocks = self.model.generate_voice_design_streaming(instruct=voice.instruct, **common)
        else:
            blocks = self.model.generate_voice_clone_streaming(
                ref_audio=voice.ref_audio, ref_text=voice.ref_text or "", xvec_only=voice.xvec_only,
                ref_spk=voice.ref_spk, ref_rvq=voice.ref_rvq, instruct=voice.instruct,
                parity_mode=self.settings.parity_mode, **common)
        try:
            for samples, _rate, _timing in blocks:
                yield samples
        finally:
            blocks.close()  # stops decoding (torch) or cancels the native stream (ggml)

"""faster-qwen3-tts runtimes for Qwen3-TTS: backend ggml (qwentts.cpp) and backend torch (CUDA graphs).

Both expose the same streaming generators, ``generate_<mode>_streaming(...)`` yielding
``(float32 samples, 24000, timing)``; neither marks the last block reliably, so the stream simply ends.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from s2s import torch_support
from s2s.config_errors import ConfigError
from s2s.stage import require

if TYPE_CHECKING:
    from s2s.tts.qwen3 import Qwen3TTS, Voice

CPU_REFUSAL = "CUDA graphs require CUDA device"  # faster-qwen3-tts's own message (model.py) for a non-CUDA device


def _load_torch(stage: Qwen3TTS) -> Any:
    torch_support.repair_torchaudio()  # qwen_tts reaches torchaudio
    faster = require("faster_qwen3_tts", backend="tts=qwen3 (backend torch)", extra="qwen3")
    dtype = torch_support.torch_dtype(stage.args["dtype"] or "auto", stage.device)
    try:
        model = faster.FasterQwen3TTS.from_pretrained(
            stage.model, device=stage.device, dtype=dtype, backend="torch",
            attn_implementation=stage.args["attn_implementation"] or "sdpa",
            # the static KV cache must hold the prompt and every generated step
            max_seq_len=max(2048, stage.args["max_new_tokens"] + 512))
    except ValueError as error:
        if CPU_REFUSAL not in str(error):
            raise
        import torch

        have = "no usable CUDA in this torch " + torch.__version__ if stage.device.startswith("cuda") else "not CUDA"
        raise ConfigError("tts.device", stage.device, f"a CUDA device for backend torch ({have}); faster-qwen3-tts "
                          f"runs it on CUDA graphs: use backend ggml or mlx on this machine") from error
    model.warmup()  # captures the CUDA graphs now rather than during the first reply
    return model


def _load_ggml(stage: Qwen3TTS) -> Any:
    faster = require("faster_qwen3_tts", backend="tts=qwen3 (backend ggml)", extra="qwen3-ggml")
    require("qwentts_cpp", backend="tts=qwen3 (backend ggml)", extra="qwen3-ggml")
    options: dict[str, Any] = {"backend": "ggml", "qwentts_ref_cache_dir": stage.args["ref_cache_dir"]}
    if stage.args["gguf_talker_path"]:
        options.update(gguf_talker_path=stage.args["gguf_talker_path"], gguf_codec_path=stage.args["gguf_codec_path"])
    else:
        options["quant"] = stage.quantization
    try:
        return faster.FasterQwen3TTS.from_pretrained(stage.model, **options)
    except OSError as error:  # the native library itself cannot load (ctypes)
        raise RuntimeError(f"qwentts.cpp could not load ({error}). PyPI's Linux wheel of qwentts-cpp-python is a "
                           "CUDA 12.8 build needing an NVIDIA driver and the CUDA 12 runtime; without a GPU use "
                           "its CPU build or tts.backend=mlx") from error


class FasterQwen3:
    """A loaded faster-qwen3-tts model of either backend, streaming one reply at a time.

    Args:
        model: ``FasterQwen3TTS`` (torch) or ``GGMLQwen3TTS`` (ggml), as ``from_pretrained`` returns them.
        voice: the voice mode and its values.
        chunk_size: codec steps per streamed block.
        max_new_tokens: cap on codec steps per reply.
        backend: ``ggml`` or ``torch``.
    """

    sample_rate = 24000

    def __init__(self, model: Any, voice: Voice, chunk_size: int, max_new_tokens: int, backend: str) -> None:
        self.model = model
        self.backend = backend
        self.voice = voice
        self.chunk_size = chunk_size
        self.max_new_tokens = max_new_tokens
        self.sample_rate = int(model.sample_rate)

    @classmethod
    def load(cls, stage: Qwen3TTS) -> FasterQwen3:
        model = _load_torch(stage) if stage.backend == "torch" else _load_ggml(stage)
        return cls(model, stage.voice, stage.args["streaming_chunk_size"], stage.args["max_new_tokens"], stage.backend)

    def speakers(self) -> list[str]:
        """Lower-case preset voices ([] for Base/VoiceDesign); torch keeps them on the wrapped qwen_tts model."""
        source = self.model.model if self.backend == "torch" else self.model
        return sorted(str(name).lower() for name in (source.get_supported_speakers() or []))

    def stream(self, text: str, language: str) -> Iterator[Any]:
        voice = self.voice
        common = {"text": text, "language": language, "max_new_tokens": self.max_new_tokens,
                  "chunk_size": self.chunk_size}
        if voice.mode == "custom_voice":
            blocks = self.model.generate_custom_voice_streaming(speaker=voice.speaker, instruct=voice.instruct,
                                                                **common)
        elif voice.mode == "voice_design":
            blocks = self.model.generate_voice_design_streaming(instruct=voice.instruct, **common)
        else:
            blocks = self.model.generate_voice_clone_streaming(
                ref_audio=voice.ref_audio, ref_text=voice.ref_text or "", xvec_only=voice.xvec_only,
                ref_spk=voice.ref_spk, ref_rvq=voice.ref_rvq, instruct=voice.instruct, **common)
        try:
            for samples, _rate, _timing in blocks:
                yield samples
        finally:
            blocks.close()  # stops decoding (torch) or cancels the native stream (ggml)

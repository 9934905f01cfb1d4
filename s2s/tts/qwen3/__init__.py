"""Qwen3-TTS (12 Hz tokenizer) with three backends behind one option: ggml, torch and mlx.

* ``ggml``: qwentts.cpp through faster-qwen3-tts's GGML adapter (GGUF weights; CUDA on Linux, Metal on Macs).
* ``torch``: faster-qwen3-tts's CUDA-graph runtime on top of qwen_tts (NVIDIA GPUs only).
* ``mlx``: mlx-audio's port (Metal on Apple silicon, mlx[cpu] elsewhere), quantized mlx-community checkpoints.

The voice comes from one of three modes, picked from the keys in this order: a cloned voice (``ref_audio`` with
its transcript ``ref_text``, or on ggml the cached ``ref_spk``/``ref_rvq`` files), a preset speaker of a
CustomVoice model (``speaker``, optionally styled by ``instruct``), or a voice described by ``instruct`` on a
VoiceDesign model.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from s2s.config_errors import MUST_EXIST, ConfigError, ConfigErrors, Range, ValidationContext
from s2s.models import model_folder_error
from s2s.runtimes import ByBackend, Runtime
from s2s.tts.base import TTSStage
from s2s.tts.qwen3.faster import FasterQwen3
from s2s.tts.qwen3.mlx import MLXQwen3
from s2s.tts.qwen3.settings import (
    DEFAULT_MODEL,
    LANGUAGES,
    QUANTIZATIONS,
    Settings,
    language_name,
    mlx_quantized_repo,
    model_kind,
    voice_of,
)

# the Hub models qwentts-cpp-python maps to published GGUF files (other models need gguf_*_path)
GGML_MODELS = tuple(f"Qwen/Qwen3-TTS-12Hz-{name}" for name in (
    "0.6B-Base", "0.6B-CustomVoice", "1.7B-Base", "1.7B-CustomVoice", "1.7B-VoiceDesign"))
GGML_ONLY = ("gguf_talker_path", "gguf_codec_path", "ref_cache_dir", "ref_spk", "ref_rvq")
TORCH_ONLY = ("dtype", "attn_implementation")
# qwentts-cpp-python publishes Linux CUDA and macOS arm64 wheels only, so faster-qwen3-tts[ggml] installs nowhere
# on Windows: Windows+NVIDIA runs torch (conf/tts_platform/qwen3_windows_cuda.yaml), where the reference runs ggml



def voice_errors(args: dict[str, Any], context: ValidationContext) -> list[ConfigError]:
    """The rules of the voice mode the keys select (clone, then custom voice, then voice design)."""
    errors: list[ConfigError] = []

    def error(key: str, expected: str) -> None:
        errors.append(context.error(key, args[key], expected))

    kind = model_kind(args["model"], args["gguf_talker_path"] if args["backend"] == "ggml" else None)
    ref_audio, ref_spk, ref_rvq, ref_text = args["ref_audio"], args["ref_spk"], args["ref_rvq"], args["ref_text"]
    speaker, instruct, xvec_only = args["speaker"], args["instruct"], args["xvec_only"]
    if ref_audio or ref_spk or ref_rvq:
        for key in ("ref_spk", "ref_rvq"):
            if ref_audio and args[key]:
                error(key, "null when ref_audio is set (a reference is either audio or cached ref_spk/ref_rvq)")
        if ref_rvq and not (ref_spk and ref_text):
            error("ref_rvq", "to come with ref_spk and ref_text (cached codes are an ICL reference)")
        if xvec_only and ref_rvq:
            error("xvec_only", "false with ref_rvq (cached codes are for ICL cloning; drop ref_rvq for x-vector)")
        if ref_audio and not ref_text and not xvec_only:
            error("ref_text", "the transcript of ref_audio (or xvec_only=true to clone the timbre only)")
        if ref_spk and ref_text and not ref_rvq and not ref_audio:
            error("ref_text", "null with ref_spk alone (a timbre-only clone); add ref_rvq for an ICL clone")
        if kind not in (None, "base"):
            error("model", f"a -Base model to clone a voice (this is a {kind} model)")
        if speaker:
            error("speaker", "null when cloning (speaker picks a preset voice of CustomVoice models)")
        if instruct and args["backend"] != "torch":
            error("instruct", f"null when cloning with backend={args['backend']} (only backend torch styles "
                              f"a cloned voice)")
        return errors
    if ref_text:
        error("ref_text", "null without ref_audio or ref_rvq (it is their transcript)")
    if xvec_only:
        error("xvec_only", "false without ref_audio (it selects x-vector-only cloning)")
    if kind == "base":
        errors.append(context.error("ref_audio", None, f"a reference voice: {args['model']} is a Base model "
                                    "with no preset voice (set ref_audio + ref_text, or ref_spk on ggml)"))
    elif kind == "voice_design" or (kind is None and not speaker and instruct):
        if speaker:
            error("speaker", "null with a VoiceDesign model (its voice comes from instruct)")
        if not instruct:
            error("instruct", "a voice description: a VoiceDesign model makes its voice from it")
    return errors


def check_backend(args: dict[str, Any], context: ValidationContext) -> list[ConfigError]:
    """Per-backend keys: each key of another backend must stay null (``Qwen3TTS.requires`` covers platform and device)."""
    errors: list[ConfigError] = []
    backend, quantization = args["backend"], args["quantization"]
    for key in GGML_ONLY:
        if backend != "ggml" and args[key] is not None:
            errors.append(context.error(key, args[key], f"null with backend={backend} ({key} is for backend ggml)"))
    for key in TORCH_ONLY:
        if backend != "torch" and args[key] is not None:
            errors.append(context.error(key, args[key], f"null with backend={backend} ({key} is for backend torch)"))
    if quantization is not None:
        if backend == "torch":
            errors.append(context.error("quantization", quantization, "null with backend=torch (it takes dtype)"))
        elif quantization not in QUANTIZATIONS[backend]:
            errors.append(context.error("quantization", quantization, f"null or one of "
                                        f"{', '.join(QUANTIZATIONS[backend])} with backend={backend}"))
        elif backend == "ggml" and args["gguf_talker_path"]:
            errors.append(context.error("quantization", quantization, "null with gguf_*_path (the GGUF files fix it)"))
        elif backend == "mlx" and mlx_quantized_repo(args["model"], quantization) == args["model"]:
            errors.append(context.error("quantization", quantization, "null unless model is a Qwen/<name> id "
                                        "(a local path or mlx-community id fixes its own quantization)"))
    non_streaming, parity = args["non_streaming_mode"], args["parity_mode"]
    if non_streaming is False and backend == "ggml":
        errors.append(context.error("non_streaming_mode", False, "null or true with backend=ggml (qwentts.cpp "
                                    "always puts the whole text in its prompt; it cannot feed it step by step)"))
    elif non_streaming is not None and backend == "mlx":
        errors.append(context.error("non_streaming_mode", non_streaming, "null with backend=mlx (mlx-audio does "
                                    "not expose it)"))
    if parity and backend != "torch":
        errors.append(context.error("parity_mode", True, f"false with backend={backend} (parity mode turns "
                                    "off the CUDA graphs of backend torch)"))
    elif parity and voice_of(args).mode != "clone":
        errors.append(context.error("parity_mode", True, "false unless cloning a voice (faster-qwen3-tts has "
                                    "parity mode for voice cloning only)"))
    if backend == "ggml":
        if bool(args["gguf_talker_path"]) != bool(args["gguf_codec_path"]):
            key = "gguf_codec_path" if args["gguf_talker_path"] else "gguf_talker_path"
            errors.append(context.error(key, args[key], "a GGUF file: gguf_talker_path and gguf_codec_path "
                                                        "go together"))
        elif not args["gguf_talker_path"] and args["model"] not in GGML_MODELS:
            errors.append(context.error("model", args["model"], f"one of {', '.join(GGML_MODELS)} with backend "
                                        "ggml (or local files via gguf_talker_path + gguf_codec_path)"))
    elif error := model_folder_error(args["model"], context, DEFAULT_MODEL):
        errors.append(error)
    return errors


class Qwen3TTS(TTSStage):
    """Qwen3-TTS, streaming, with the backend picked per platform (ggml, torch or mlx).

    Args:
        model: Hub id or local folder (HF layout; mlx also takes mlx-community ids).
        backend: ggml (qwentts.cpp), torch (CUDA graphs) or mlx (mlx-audio).
        device: torch device for backend torch (must be CUDA); ggml and mlx pick their own accelerator,
            except that ``cpu`` keeps mlx on the CPU.
        language: auto (the STT's language per turn, else the model guesses) or a language name or code.
        speaker: preset voice of a CustomVoice model (null: Aiden).
        instruct: speaking style (CustomVoice), or the voice description (VoiceDesign).
        ref_audio, ref_text: voice to clone (Base models) and its transcript.
        xvec_only: clone the timbre only (speaker embedding), without ref_text.
        ref_spk, ref_rvq: ggml only, cached qwentts.cpp reference files (.spk, and .rvq with ref_text).
        streaming_chunk_size: codec steps per streamed block (12.5 steps = 1 s of audio); null: 4 on mlx,
            8 on ggml and torch.
        max_new_tokens: cap on codec steps per utterance; each gets its estimated length (at least 360 steps)
            up to this cap, so a model that misses its end token stops early.
        non_streaming_mode: faster-qwen3-tts only: the whole text in the prompt (true) or fed step by step
            (false, torch only); null: the library's choice.
        parity_mode: torch only, when cloning: no CUDA graphs (a dynamic cache), output as qwen_tts's own.
        blocksize: samples (24 kHz) per audio block the stage emits; null: the blocks the library streams.
        quantization: ggml BF16/Q8_0/Q4_K_M/F32, mlx bf16/4bit/6bit/8bit; null: the backend's default.
        gguf_talker_path, gguf_codec_path: ggml only, local GGUF files instead of downloading them.
        ref_cache_dir: ggml only, where extracted voice references are cached (null: the library's default).
        dtype: torch only, auto (bf16 where supported, else fp16) or an explicit torch dtype name.
        attn_implementation: torch only, eager, sdpa or flash_attention_2 (null: sdpa, the library's).
    """

    voice_key = "speaker"

    sample_rate = 24000
    # the runtime each backend needs; the platform configs say where a runtime is unavailable, and why
    requires = ByBackend({
        "ggml": Runtime("qwentts_cpp"),
        "torch": Runtime("cuda_graphs", device="cuda", device_reason="faster-qwen3-tts's torch backend runs on "
                         "CUDA graphs (Linux or Windows with an NVIDIA GPU); otherwise pick another backend"),
        "mlx": Runtime("mlx"),
    }, none_left="another TTS: no Qwen3-TTS backend runs")

    def __init__(self, model: str = DEFAULT_MODEL, backend: Literal["ggml", "torch", "mlx"] = "ggml",
                 device: str = "auto", language: str = "auto", speaker: str | None = None,
                 instruct: str | None = None, ref_audio: Annotated[str | None, MUST_EXIST] = None,
                 ref_text: str | None = None, xvec_only: bool = False,
                 ref_spk: Annotated[str | None, MUST_EXIST] = None, ref_rvq: Annotated[str | None, MUST_EXIST] = None,
                 streaming_chunk_size: Annotated[int, Range(1, 256)] | None = None,
                 max_new_tokens: Annotated[int, Range(1, 65536)] = 2048, non_streaming_mode: bool | None = None,
                 parity_mode: bool = False, blocksize: Annotated[int, Range(64, 240000)] | None = None,
                 quantization: str | None = None,
                 gguf_talker_path: Annotated[str | None, MUST_EXIST] = None,
                 gguf_codec_path: Annotated[str | None, MUST_EXIST] = None, ref_cache_dir: str | None = None,
                 dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = None,
                 attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None) -> None:
        # validated before construction (validate_config): here the arguments are only resolved
        self.settings = Settings.from_args({name: value for name, value in locals().items()
                                            if name not in ("self", "__class__")})
        self.blocksize = self.settings.blocksize  # the base class regroups the blocks
        self._runtime: FasterQwen3 | MLXQwen3 | None = None

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        errors = check_backend(kwargs, context)
        if language_name(kwargs["language"]) is None:
            errors.append(context.error("language", kwargs["language"], "auto or one of " + ", ".join(
                f"{code} ({name})" for code, name in LANGUAGES.items())))
        errors += voice_errors(kwargs, context)
        if errors:
            raise ConfigErrors(errors)

    def setup(self) -> None:
        settings = self.settings
        runtime = (MLXQwen3 if settings.backend == "mlx" else FasterQwen3).load(settings)
        self._runtime = runtime
        self.sample_rate = int(runtime.model.sample_rate)  # 24000 for every published model
        speakers = runtime.speakers()
        speaker = settings.voice.speaker
        if speaker and speakers and speaker.lower() not in speakers:
            raise ConfigError("tts.speaker", speaker, f"a voice of {settings.model}: {', '.join(speakers)}")

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        assert self._runtime is not None, "setup() first"
        if self.settings.language != "Auto":
            turn_language = self.settings.language
        else:  # the STT's code for this turn, when the model speaks it
            turn_language = language_name(language) or "Auto"
        return self._runtime.stream(text, turn_language)

    def close(self) -> None:
        self._runtime = None

    def describe(self) -> dict[str, Any]:
        settings = self.settings
        details: dict[str, Any] = {"backend": settings.backend}
        if settings.backend == "mlx":
            details["model"] = settings.mlx_repo
            details["device"] = "cpu" if settings.device == "cpu" else "mlx default (Metal on Apple silicon)"
        elif settings.backend == "ggml":
            gguf = settings.gguf_talker_path
            details["model"] = f"{gguf} + {settings.gguf_codec_path}" if gguf else settings.model
            details["quantization"] = "from the GGUF files" if gguf else settings.quantization
            details["device"] = "ggml picks (the GPU in CUDA/Metal builds)"
        else:
            details.update(model=settings.model, dtype=settings.dtype or "auto",
                           attn_implementation=settings.attn_implementation)
            if settings.parity_mode:
                details["parity_mode"] = True
        details.update(voice=str(settings.voice), language=settings.language,
                       streaming_chunk_size=settings.streaming_chunk_size)
        return details

"""What a Qwen3-TTS runtime is given: the resolved settings of one stage, its voice, and the pure helpers.

The runtimes (``faster``, ``mlx``) import only this module; the stage (``s2s.tts.qwen3``) builds a
:class:`Settings` from its validated arguments and hands it to the runtime it loads.
"""
from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from s2s.languages import LANGUAGE_NAMES, language_name as code_name
from s2s.models import local_path

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"
DEFAULT_SPEAKER = "Aiden"
QUANTIZATIONS = {"ggml": ("BF16", "Q8_0", "Q4_K_M", "F32"), "mlx": ("bf16", "4bit", "6bit", "8bit")}
DEFAULT_QUANTIZATION = {"ggml": "BF16", "mlx": "6bit"}
# the languages Qwen3-TTS speaks, by the names it takes (the Whisper family's, s2s.languages)
LANGUAGES = {code: LANGUAGE_NAMES[code] for code in ("en", "zh", "ja", "de", "fr", "es", "it", "pt", "ru", "ko")}

Backend = Literal["ggml", "torch", "mlx"]

FRAME_RATE = 12.5  # codec steps per second of audio
# codec steps per streamed block when not configured: the reference system's defaults (mlx 0.32 s, faster 0.64 s)
DEFAULT_CHUNK_SIZE = {"mlx": 4, "ggml": 8, "torch": 8}
# torch: faster-qwen3-tts's own; eager (the reference's) was 7% slower to first audio on an H200 (README)
DEFAULT_ATTENTION = "sdpa"
# How long a text takes to say, to size each reply's codec-step budget (the reference system's estimate): the
# slower of words and characters, half a second per punctuation mark, a second of prompt, and 35% to spare.
WORDS_PER_S, CHARS_PER_S, PAUSE_S, PROMPT_S, MARGIN = 2.6, 14.0, 0.5, 1.0, 1.35
MIN_REPLY_STEPS = 360  # 28.8 s: a short text's budget is never the estimate's to cut


def reply_steps(text: str, cap: int, chunk: int) -> int:
    """The codec steps one utterance may take: its estimated length, in whole blocks, at most ``cap``.

    A model that misses its end-of-speech token then stops after a few seconds of babble, not after ``cap``.
    """
    words = len(re.findall(r"\w+", text))
    chars = len(re.sub(r"\s+", "", text))
    pauses = sum(unicodedata.category(char).startswith("P") for char in text)
    seconds = max(words / WORDS_PER_S, chars / CHARS_PER_S) + pauses * PAUSE_S + PROMPT_S
    steps = math.ceil(math.ceil(seconds * FRAME_RATE * MARGIN) / chunk) * chunk
    return min(cap, max(MIN_REPLY_STEPS, steps))


@dataclass(frozen=True)
class Voice:
    """The voice mode a config selects, with the values that mode uses."""

    mode: Literal["clone", "custom_voice", "voice_design"]
    speaker: str | None = None
    instruct: str | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    xvec_only: bool = False
    ref_spk: str | None = None
    ref_rvq: str | None = None

    def __str__(self) -> str:
        if self.mode == "custom_voice":
            return f"speaker {self.speaker}" + (" + instruct" if self.instruct else "")
        if self.mode == "voice_design":
            return "designed by instruct"
        source = "ref_audio" if self.ref_audio else "ref_spk" + ("+ref_rvq" if self.ref_rvq else "")
        return f"clone of {source}" + (" (x-vector only)" if self.xvec_only else "")


def model_kind(model: str, gguf_talker_path: str | None = None) -> str | None:
    """``base``, ``custom_voice`` or ``voice_design`` from a local config.json or the model/GGUF name, else None."""
    folder = local_path(model)
    if folder is not None and (config := folder / "config.json").is_file():
        try:
            return json.loads(config.read_text()).get("tts_model_type")
        except (OSError, ValueError):
            return None
    name = Path(gguf_talker_path).name if gguf_talker_path else model
    for pattern, kind in ((r"custom_?voice", "custom_voice"), (r"voice_?design", "voice_design"),
                          (r"(^|[-_/])base([-_.]|$)", "base")):
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return None


def language_name(value: str | None) -> str | None:
    """``en``/``EN``/``english`` -> ``English``; ``auto`` -> ``Auto``; None for anything the model does not speak."""
    if not value:
        return None
    value = value.strip().lower()
    if value == "auto":
        return "Auto"
    name = code_name(value) or next((name for name in LANGUAGES.values() if name.lower() == value), None)
    return name if name in LANGUAGES.values() else None


def mlx_quantized_repo(model: str, quantization: str | None) -> str:
    """``Qwen/<name>`` -> ``mlx-community/<name>-<quantization>``; local paths and other ids pass through."""
    if model.startswith("Qwen/") and local_path(model) is None:
        return f"mlx-community/{model.split('/', 1)[1]}-{quantization or DEFAULT_QUANTIZATION['mlx']}"
    return model


def voice_of(args: dict[str, Any]) -> Voice:
    """The voice mode the keys select: a clone (any reference), else voice design, else a preset speaker.

    It only reads the keys; whether they fit the model and each other is the validator's business.
    """
    if args["ref_audio"] or args["ref_spk"] or args["ref_rvq"]:
        return Voice("clone", instruct=args["instruct"], ref_audio=args["ref_audio"], ref_text=args["ref_text"],
                     xvec_only=args["xvec_only"], ref_spk=args["ref_spk"], ref_rvq=args["ref_rvq"])
    kind = model_kind(args["model"], args["gguf_talker_path"] if args["backend"] == "ggml" else None)
    if kind == "voice_design" or (kind is None and not args["speaker"] and args["instruct"]):
        return Voice("voice_design", instruct=args["instruct"])
    return Voice("custom_voice", speaker=args["speaker"] or DEFAULT_SPEAKER, instruct=args["instruct"])


@dataclass(frozen=True)
class Settings:
    """One stage's settings, resolved: defaults filled in, the language named, the voice mode chosen.

    Args:
        model: Hub id or local folder, as configured.
        backend: ggml, torch or mlx.
        device: the resolved device (torch needs CUDA; ``cpu`` keeps mlx on the CPU).
        language: the fixed language name, or ``Auto`` (the STT's language per turn).
        voice: the voice mode and its values.
        streaming_chunk_size: codec steps per streamed block (the backend's default when not configured).
        max_new_tokens: cap on codec steps per utterance (each gets :func:`reply_steps` of it).
        non_streaming_mode: faster-qwen3-tts: the whole text in the prompt (True) or fed step by step (False);
            None: the library's choice.
        parity_mode: torch clones without CUDA graphs (dynamic cache), as qwen_tts itself does.
        blocksize: samples per audio block the stage emits (None: as the library makes them).
        quantization: the quantization the backend loads (its default when not configured; None for torch).
        gguf_talker_path, gguf_codec_path, ref_cache_dir: ggml only.
        dtype, attn_implementation: torch only (attention: sdpa when not configured).
    """

    model: str
    backend: Backend
    device: str
    language: str
    voice: Voice
    streaming_chunk_size: int
    max_new_tokens: int
    non_streaming_mode: bool | None = None
    parity_mode: bool = False
    blocksize: int | None = None
    quantization: str | None = None
    gguf_talker_path: str | None = None
    gguf_codec_path: str | None = None
    ref_cache_dir: str | None = None
    dtype: str | None = None
    attn_implementation: str | None = None

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> Settings:
        """From the stage's (validated) constructor arguments."""
        return cls(model=args["model"], backend=args["backend"], device=args["device"],
                   language=language_name(args["language"]) or "Auto", voice=voice_of(args),
                   streaming_chunk_size=args["streaming_chunk_size"] or DEFAULT_CHUNK_SIZE[args["backend"]],
                   max_new_tokens=args["max_new_tokens"], non_streaming_mode=args["non_streaming_mode"],
                   parity_mode=args["parity_mode"], blocksize=args["blocksize"],
                   quantization=args["quantization"] or DEFAULT_QUANTIZATION.get(args["backend"]),
                   gguf_talker_path=args["gguf_talker_path"], gguf_codec_path=args["gguf_codec_path"],
                   ref_cache_dir=args["ref_cache_dir"], dtype=args["dtype"],
                   attn_implementation=args["attn_implementation"]
                   or (DEFAULT_ATTENTION if args["backend"] == "torch" else None))

    def steps_for(self, text: str) -> int:
        """The codec-step budget of one utterance."""
        return reply_steps(text, self.max_new_tokens, self.streaming_chunk_size)

    @property
    def mlx_repo(self) -> str:
        """What mlx-audio loads: the mlx-community conversion of a ``Qwen/`` id, or the model as given."""
        return mlx_quantized_repo(self.model, self.quantization)

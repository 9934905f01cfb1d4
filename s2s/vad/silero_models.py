"""Silero VAD's packaged models, called one 32 ms frame at a time: the ONNX export (the default) and TorchScript."""
from __future__ import annotations

from typing import Any

import numpy as np

from s2s.stage import MissingExtraError, require

RATE = 16000
CONTEXT = 64  # samples of the previous frame the ONNX model sees before each new one (as silero-vad feeds it)


class OnnxSilero:
    """Silero's packaged ONNX export through onnxruntime, fed as silero-vad's own ``OnnxWrapper`` feeds it; no torch
    (the file is found without importing ``silero_vad``, whose ``__init__`` imports torch)."""

    def __init__(self, onnxruntime: Any, threads: int | None) -> None:
        from s2s.models import package_file
        from s2s.onnx import cpu_session

        path = package_file("silero_vad", "data", "silero_vad.onnx")
        if path is None:
            raise MissingExtraError("vad=silero", "silero_vad", None)
        # 32 ms frames: one thread is plenty; the model is stateless (its state is an input), so one session serves
        self._session = cpu_session(onnxruntime, path, threads or 1)
        self._rate = np.array(RATE, dtype=np.int64)
        self.reset_states()

    def reset_states(self) -> None:
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)

    def __call__(self, frame: np.ndarray) -> float:
        window = np.concatenate([self._context, frame])[None, :]
        probability, self._state = self._session.run(None, {"input": window, "state": self._state, "sr": self._rate})
        self._context = frame[-CONTEXT:]
        return float(probability[0, 0])


class TorchSilero:
    """The packaged TorchScript model (``vad.onnx=false``), with the same call as :class:`OnnxSilero`."""

    def __init__(self) -> None:
        self._torch = require("torch", backend="vad=silero", extra=None)
        self._model = require("silero_vad", backend="vad=silero", extra=None).load_silero_vad()

    def reset_states(self) -> None:
        self._model.reset_states()

    def __call__(self, frame: np.ndarray) -> float:
        with self._torch.no_grad():
            return float(self._model(self._torch.from_numpy(np.ascontiguousarray(frame)), RATE))

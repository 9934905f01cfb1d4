"""onnxruntime sessions for the stages that run ONNX models on the CPU, with the thread budget stated once."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from s2s.sharing import shared_model


def cpu_session(onnxruntime: Any, path: str | Path, threads: int | None) -> Any:
    """An ``InferenceSession`` of ``path`` on the CPU, shared while the realtime server shares weights.

    Args:
        onnxruntime: the imported module (the stage imported it through ``require``, naming its extra).
        path: the ``.onnx`` file.
        threads: the runner's budget for the stage; None: a launcher's per-job one (joblib and Ray set
            ``OMP_NUM_THREADS``), else onnxruntime decides.
    """
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    launcher = os.environ.get("OMP_NUM_THREADS", "")
    options.intra_op_num_threads = threads or (int(launcher) if launcher.isdigit() else 0)
    return shared_model(("onnxruntime", str(path), options.intra_op_num_threads),
                        lambda: onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]))


def cache_layout(session: Any) -> tuple[int, int, int]:
    """A decoder session's cache as its inputs declare it (``past_k_<layer>``: [1, heads, past, size]): the layers,
    and each layer's heads and head size."""
    layers = sum(1 for value in session.get_inputs() if value.name.startswith("past_k_"))
    shape = next(value.shape for value in session.get_inputs() if value.name == "past_k_0")
    return layers, int(shape[1]), int(shape[3])

"""Imports of torch-based libraries in one place, with the CPU-torch / CUDA-torchaudio repair applied first.

ChatTTS, vocos and faster-qwen3-tts pull torchaudio 2.11.1, a CUDA build; beside a CPU build of torch its C++
extension fails to load, and because transformers imports torchaudio whenever it is installed, every model
import would then fail. ``repair_torchaudio()`` registers a stub for the extension only when it cannot load, so the
pure-Python parts (MelSpectrogram, resample) keep working; on a matching CUDA install it changes nothing.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
import types
from pathlib import Path

log = logging.getLogger(__name__)
_prepared = False


def _torchaudio_extension_loads(library: Path) -> bool:
    import torch

    try:
        torch.ops.load_library(str(library))
        return True
    except OSError:
        return False


def _stub_extension() -> types.ModuleType:
    def fail_if_no_align(func):  # noqa: ANN001 - mirrors torchaudio's decorator
        def unavailable(*args, **kwargs):
            raise RuntimeError("torchaudio's C++ extension is unavailable (CUDA torchaudio wheel, CPU torch)")
        return unavailable

    stub = types.ModuleType("torchaudio._extension")
    stub._IS_TORCHAUDIO_EXT_AVAILABLE = False
    stub._IS_ALIGN_AVAILABLE = False
    stub.fail_if_no_align = fail_if_no_align
    stub._check_cuda_version = lambda: None
    stub._load_lib = lambda name: False
    return stub


def repair_torchaudio() -> None:
    """Call before importing transformers, kokoro, ChatTTS, qwen_tts or anything else that reaches torchaudio."""
    global _prepared
    if _prepared:
        return
    _prepared = True
    if "torchaudio._extension" in sys.modules:
        return
    spec = importlib.util.find_spec("torchaudio")
    if spec is None or spec.origin is None:
        return
    library = Path(spec.origin).parent / "lib" / "_torchaudio.so"
    if library.exists() and not _torchaudio_extension_loads(library):
        sys.modules["torchaudio._extension"] = _stub_extension()
        log.debug("torchaudio's CUDA extension cannot load beside this torch; using its pure-Python parts")


def torch_dtype(name: str, device: str):  # noqa: ANN201 - returns a torch.dtype
    """``auto`` -> bfloat16 where the device supports it, float16 on other GPUs, float32 on CPU."""
    import torch

    if name != "auto":
        return getattr(torch, name)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device == "mps":
        return torch.float16
    return torch.float32


def usable_device(device: str) -> str:
    """The torch device to load on; fails clearly when this machine lacks it (called at setup).

    Config validation has already turned ``auto`` into the platform's accelerator; a stage built directly
    with ``auto`` runs on the CPU.
    """
    if device in ("cpu", "auto"):
        return "cpu"
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device={device} was chosen but this machine has no usable CUDA "
                           f"(torch {torch.__version__}); use device=cpu or device=auto")
    if device == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError("device=mps was chosen but MPS is not available here; use device=cpu or device=auto")
    return device


def empty_caches() -> None:
    """Give the memory torch caches for reuse back (only where torch is already imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        mps.empty_cache()

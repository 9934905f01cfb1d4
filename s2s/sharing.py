"""Model weights shared by the stages of one process that load the same model (the realtime server's pipelines).

Off by default, so a local run or a sweep job loads and frees its models as before (the jobs of a sweep in one
process compare their peak memory). ``python run.py server=realtime`` turns it on before building its
``max_sessions`` pipelines: each pipeline keeps its own stage objects (tokenizer, voice, the conversation it is
lent), while the weights that are safe to use from several threads at once (a CTranslate2 Whisper, a torch model
in ``eval`` mode, an onnxruntime session) are loaded once.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")

_enabled = False
_users = 1
_models: dict[Hashable, Any] = {}
_locks: dict[Hashable, threading.Lock] = {}
_guard = threading.Lock()


def enable(on: bool = True, users: int = 1) -> None:
    """Share from now on among ``users`` pipelines (``False``: stop sharing and forget what was shared)."""
    global _enabled, _users
    with _guard:
        _enabled = on
        _users = users if on else 1
        if not on:
            _models.clear()
            _locks.clear()


def shared_model(key: Hashable, load: Callable[[], T]) -> T:
    """``load()``'s result, loaded once per ``key`` while sharing is on (everything that defines the model)."""
    if not _enabled:
        return load()
    with _guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:  # a second stage asking for the same model waits for the first load instead of repeating it
        if key not in _models:
            _models[key] = load()
        return _models[key]


def users() -> int:
    """How many pipelines may call a shared model at the same time (1 while sharing is off).

    A library that serialises calls on one worker (CTranslate2's ``inter_threads``, faster-whisper's
    ``num_workers``) gets this many workers over the one copy of the weights: otherwise one session's reply,
    whose generation is paced by its reader, holds every other session's turn behind it.
    """
    with _guard:
        return _users


def shared_count() -> int:
    """How many models are held for sharing."""
    with _guard:
        return len(_models)

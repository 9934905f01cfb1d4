"""Spies for tests: record the calls a stage makes into a library while the library's real code runs, and count
how many calls overlap."""
from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class Call:
    """One call of a spied entry point.

    Attributes:
        args: The positional arguments: ``self`` included for a plain method, ``cls`` left out for a classmethod.
        kwargs: The keyword arguments.
        result: What the real code returned; a generator is the library's own, returned as is and not consumed.
    """

    args: tuple
    kwargs: dict
    result: Any


def spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[Call]:
    """Wrap ``owner.name`` so that every call runs the real code and is then recorded.

    ``owner`` is a class or a module. The entry point may be a plain method (inherited too: the wrapper then
    shadows it on ``owner``), a classmethod, a staticmethod or a module-level function; the wrapper keeps its
    kind, so callers see no difference. ``monkeypatch`` restores the original when the test ends.

    Args:
        monkeypatch: The test's ``monkeypatch`` fixture.
        owner: The class or module that holds the entry point, e.g. ``transformers.VitsModel`` or
            ``mlx_audio.tts.utils``.
        name: The attribute to wrap, e.g. ``"from_pretrained"``.

    Returns:
        The calls so far, oldest first; the list fills as the test goes on. A call is recorded once the real code
        has returned, so one that raises is not recorded.
    """
    real = inspect.getattr_static(owner, name)  # as stored: classmethod and staticmethod objects unbound
    wrapped = isinstance(real, (classmethod, staticmethod))
    function = real.__func__ if wrapped else real
    skip = int(isinstance(real, classmethod))  # a classmethod's cls is not recorded
    calls: list[Call] = []

    def wrapper(*args, **kwargs):
        result = function(*args, **kwargs)
        calls.append(Call(args[skip:], kwargs, result))
        return result

    monkeypatch.setattr(owner, name, type(real)(wrapper) if wrapped else wrapper)
    return calls


class Overlap:
    """Counts the calls inside :meth:`call` at once: ``running`` now, ``most`` ever."""

    def __init__(self) -> None:
        self.running = self.most = 0
        self._lock = threading.Lock()

    @contextmanager
    def call(self) -> Iterator[None]:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1

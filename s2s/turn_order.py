"""Which pipeline's model call runs next when a server has more pipelines than cores: the turn that ended first.

Off by default (a local run has one pipeline). With four sessions on two cores, every model call used to get an
equal share of the CPU: turns that ended together all finished late together, and, their users answered at the
same moment, they ended together again turn after turn. The realtime server turns the order on
(:func:`configure`) with as many slots as its pipelines' threads fill the cores; each model stage's call then
waits for a slot, and the waiting call that goes first is the one ranked first:

1. a turn's work until its first reply audio, by when that turn's speech was let go (first come, first served);
2. the rest of a reply (its audio is already playing, and the TTS runs faster than it plays);
3. work ahead of a turn (partial transcripts while the user speaks), by when it was asked for.

A call holds its slot while it computes and never while it waits for another stage, so no call waits on
itself. Work served in order of arrival finishes sooner on average than work sharing the CPU, and simultaneous
turns stop staying in step.
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

from s2s.messages import Message, Progress

T = TypeVar("T")

FIRST, REST, AHEAD = 0, 1, 2  # the classes above, in rank order
Rank = tuple[int, float]

_order: Order | None = None
_END = object()


class Order:
    """At most ``slots`` holders at once; a free slot goes to the waiter of the lowest rank (then the oldest)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._free = slots
        self._waiting: list[tuple[Rank, int]] = []
        self._changed = threading.Condition()
        self._count = itertools.count()

    @contextmanager
    def slot(self, rank: Rank) -> Iterator[None]:
        entry = (rank, next(self._count))
        with self._changed:
            heapq.heappush(self._waiting, entry)
            try:
                while not (self._free > 0 and self._waiting[0] == entry):
                    self._changed.wait()
            finally:  # served, or interrupted while waiting: either way it waits no more
                self._waiting.remove(entry)
                heapq.heapify(self._waiting)
            self._free -= 1
            self._changed.notify_all()  # another free slot goes to the next in line
        try:
            yield
        finally:
            with self._changed:
                self._free += 1
                self._changed.notify_all()


def configure(slots: int | None) -> None:
    """Order model calls over ``slots`` slots from now on (None: off, every call runs at once)."""
    global _order
    _order = None if slots is None else Order(max(1, slots))


def slots() -> int | None:
    return None if _order is None else _order.slots


def slot(rank: Rank, on_cores: bool = True) -> Any:
    """A context that holds a slot (at once while the order is off, or for a call that is not ``on_cores``)."""
    order = _order
    return nullcontext() if order is None or not on_cores else order.slot(rank)


def ahead() -> Rank:
    """The rank of work ahead of a turn, asked for now."""
    return AHEAD, time.monotonic()


class Ranks:
    """One pipeline's turns: when each was let go, and whether its first reply audio has been made."""

    def __init__(self) -> None:
        self._since: dict[int, float] = {}
        self._spoke: set[int] = set()
        self._lock = threading.Lock()

    def of(self, message: Message) -> Rank:
        turn = getattr(message, "turn", None)
        if isinstance(message, Progress) or not isinstance(turn, int):
            return ahead()
        with self._lock:
            if turn not in self._since:
                for old in [key for key in self._since if key < turn - 8]:  # bounded: recent turns only
                    del self._since[old]
                    self._spoke.discard(old)
                self._since[turn] = time.monotonic()
            return (REST if turn in self._spoke else FIRST), self._since[turn]

    def spoke(self, turn: int) -> None:
        with self._lock:
            self._spoke.add(turn)


def ordered(outputs: Iterator[T], rank: Any) -> Iterator[T]:
    """``outputs``, each computed while holding a slot of rank ``rank()`` (asked again for each output)."""
    if _order is None:
        yield from outputs
        return
    try:
        while True:
            with slot(rank()):
                output = next(outputs, _END)
            if output is _END:
                return
            yield output  # type: ignore[misc]
    finally:
        close = getattr(outputs, "close", None)
        if close:
            close()

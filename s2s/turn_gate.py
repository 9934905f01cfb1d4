"""The turn gate: the one place that decides what of a turn may reach the user now.

A speculative ``SpeechSegment`` opens a turn whose reply is made early but held; ``TurnConfirmed`` releases
what was held, in order, before anything newer; ``TurnDiscarded`` drops it and marks the turn stale, so work
still on its way is dropped too. Barge-in (``SpeechStarted``) and ``cancel_below`` make older turns stale.
In half duplex, a live microphone is heard as silence (``deaf``) from the end of the user's turn until its reply has
played.

The gate is pure: it sees messages, hands what may reach the sink to ``deliver`` and tells its listeners
(e.g. the metrics Recorder) what happened to a turn. It never sees a stage, a queue or a thread, and is
thread-safe: listeners are called outside its lock, so they may ask it questions. An *early* listener (e.g. the
realtime server's observer, whose held protocol events must go out before the turn's held audio) is told
under the lock, at the moment it happens: before a confirmed turn's held messages are delivered.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from s2s.messages import Message, SpeechSegment, SpeechStarted, TurnConfirmed, TurnDiscarded

log = logging.getLogger(__name__)

OPENED, CONFIRMED, DISCARDED, CANCELLED = "opened", "confirmed", "discarded", "cancelled"


@dataclass(frozen=True)
class TurnEvent:
    """What happened to a turn: ``opened`` (speculative, held), ``confirmed``, ``discarded``, or ``cancelled``
    (every turn below ``turn`` is stale: barge-in or an explicit cancel)."""

    kind: str
    turn: int


T = TypeVar("T")


class Holding(Generic[T]):
    """What waits for speculative turns to be confirmed, per turn, in order: the one hold-until-confirmed buffer
    (the gate holds messages bound for the sink, the server's observer protocol events, the Recorder its console
    lines). Not thread-safe: its owner holds its own lock around it."""

    def __init__(self) -> None:
        self._held: dict[int, list[T]] = {}

    def open(self, turn: int) -> None:
        """``turn`` is speculative: what comes for it from now on waits."""
        self._held.setdefault(turn, [])

    def __contains__(self, turn: int) -> bool:
        return turn in self._held

    def hold(self, turn: int | None, item: T) -> bool:
        """Keep ``item`` if ``turn`` is open (True); False: it need not wait."""
        if turn is None or turn not in self._held:
            return False
        self._held[turn].append(item)
        return True

    def release(self, turn: int) -> list[T] | None:
        """``turn`` is confirmed: what it held, in order (None: it was not open)."""
        return self._held.pop(turn, None)

    def drop(self, turn: int) -> None:
        """``turn`` is discarded: what it held goes nowhere."""
        self._held.pop(turn, None)


def _drop(message: Message) -> None:
    """The default ``deliver``: nowhere (a gate that only keeps the state, e.g. the Recorder's own)."""


class TurnGate:
    """Speculation, confirmation, discards, cancellation and half duplex for one conversation.

    Args:
        deliver: called with each message that may reach the sink, in order (under the gate's lock, so
            released messages come before anything newer).
        barge_in: a ``SpeechStarted`` makes every older turn stale.
        half_duplex: the input is ignored from the end of the user's turn until its reply has played.
    """

    def __init__(self, deliver: Callable[[Message], None] = _drop, *, barge_in: bool = False,
                 half_duplex: bool = False) -> None:
        self.deliver = deliver
        self.barge_in, self.half_duplex = barge_in, half_duplex
        self._lock = threading.Lock()
        self._held: Holding[Message] = Holding()  # unconfirmed speculative turns: what was bound for the sink
        self._discarded: set[int] = set()  # attempts the user spoke over: all their data is stale
        self._cancel_below = -1  # data for turns below this is stale; only ever grows
        self._deaf_turn: int | None = None
        self._listeners: list[Callable[[TurnEvent], None]] = []
        self._early: list[Callable[[TurnEvent], None]] = []

    # ------------------------------------------------------------------ what the graph tells it
    def listen(self, listener: Callable[[TurnEvent], None], *, early: bool = False) -> None:
        """Call ``listener`` with every :class:`TurnEvent` from now on (in the thread that caused it).

        ``early``: under the gate's lock, before a confirmed turn's held messages are delivered; such a
        listener must not call the gate (it would wait on its own lock) nor wait on anyone who does.
        """
        with self._lock:
            (self._early if early else self._listeners).append(listener)

    def observe(self, message: Message) -> None:
        """A message as its stage first emits it (not again as later stages pass a control on)."""
        event: TurnEvent | None = None
        with self._lock:
            if isinstance(message, SpeechSegment):
                if message.speculative:
                    if message.turn not in self._held and message.turn not in self._discarded:
                        self._held.open(message.turn)
                        event = self._tell_early(TurnEvent(OPENED, message.turn))
                elif self.half_duplex:
                    self._deaf_turn = message.turn
            elif isinstance(message, TurnConfirmed):
                held = self._held.release(message.turn)
                if held is not None:
                    event = self._tell_early(TurnEvent(CONFIRMED, message.turn))
                    for waiting in held:  # in order, before anything newer
                        self.deliver(waiting)
                if self.half_duplex:
                    self._deaf_turn = message.turn
            elif isinstance(message, TurnDiscarded):
                if message.turn not in self._discarded:
                    log.info("turn %d: the user went on speaking; its speculative reply is dropped", message.turn)
                    self._discarded.add(message.turn)
                    self._held.drop(message.turn)
                    event = self._tell_early(TurnEvent(DISCARDED, message.turn))
            elif isinstance(message, SpeechStarted) and self.barge_in:
                event = self._cancel(message.turn, "barge-in: user started turn %d, dropping older replies")
        self._publish(event)

    def admit(self, message: Message) -> None:
        """``message`` is bound for the sink: deliver it now, or hold it until its turn is confirmed."""
        turn = getattr(message, "turn", None)
        with self._lock:
            if not self._held.hold(turn, message):
                self.deliver(message)

    def cancel_below(self, turn: int) -> None:
        """Make every turn below ``turn`` stale (barge-in, or the realtime server's ``response.cancel``)."""
        with self._lock:
            event = self._cancel(turn, "cancel: dropping replies to turns below %d")
        self._publish(event)

    def played(self, turn: int) -> None:
        """The reply to ``turn`` has left the sink: in half duplex, the input is heard again."""
        with self._lock:
            if turn == self._deaf_turn:
                self._deaf_turn = None

    # ------------------------------------------------------------------ what anyone may ask it
    def is_stale(self, turn: int | None) -> bool:
        """Work for ``turn`` is to be dropped (discarded or cancelled); None (no turn) never is."""
        with self._lock:
            return turn is not None and (turn < self._cancel_below or turn in self._discarded)

    def is_pending(self, turn: int) -> bool:
        """``turn`` is speculative and neither confirmed nor discarded yet."""
        with self._lock:
            return turn in self._held

    def is_discarded(self, turn: int) -> bool:
        with self._lock:
            return turn in self._discarded

    @property
    def deaf(self) -> bool:
        """Half duplex: the assistant is replying, the input is ignored."""
        return self._deaf_turn is not None

    # ------------------------------------------------------------------ inside
    def _cancel(self, turn: int, note: str) -> TurnEvent | None:
        if turn <= self._cancel_below:
            return None
        log.info(note, turn)
        self._cancel_below = turn
        return self._tell_early(TurnEvent(CANCELLED, turn))

    def _tell_early(self, event: TurnEvent) -> TurnEvent:
        """The early listeners hear of ``event`` now, under the lock; the others once it is released."""
        for listener in self._early:
            listener(event)
        return event

    def _publish(self, event: TurnEvent | None) -> None:
        if event is None:
            return
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(event)

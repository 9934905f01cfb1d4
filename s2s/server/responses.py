"""A session's responses as a state machine: which reply the client hears now, which wait, which are done.

The Realtime protocol sends one response at a time. A response is made for each user turn (spoken or typed)
and for each continuation of a turn after the client answered a tool call; it waits (queued) while the one
ahead of it is sent, and what the graph produces for it meanwhile is held and replayed when it opens.

This module knows no socket, no event loop and no graph: each method returns the :class:`Step` s it took,
in order, and the session's translator turns them into server events.

States and moves (any other move is ignored: a finished response stays finished)::

    queued --open--> active --complete--> completed
    queued --cancel--> cancelled (never announced)      active --cancel--> cancelled
    queued --fail--> failed (never announced)           active --fail--> failed
"""
from __future__ import annotations

import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from s2s.usage import Usage


class State(str, Enum):
    """Where a response is; the finished ones' values are the protocol's ``response.status``."""

    QUEUED = "queued"
    ACTIVE = "in_progress"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"


MOVES: dict[tuple[State, str], State] = {
    (State.QUEUED, "open"): State.ACTIVE,
    (State.QUEUED, "cancel"): State.CANCELLED,
    (State.QUEUED, "fail"): State.FAILED,
    (State.ACTIVE, "complete"): State.COMPLETED,
    (State.ACTIVE, "cancel"): State.CANCELLED,
    (State.ACTIVE, "fail"): State.FAILED,
}
FINISHED = (State.COMPLETED, State.CANCELLED, State.FAILED)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass(eq=False)
class Response:
    """One reply. The queue moves its ``state``; the translator fills in what was sent (transcript, audio, calls).

    Args:
        turn: the user turn it answers (a tool continuation answers the same turn again).
        user_text: what the turn asked; None for a tool continuation (the LLM's history has the question).
        out_of_band: ``conversation: "none"``: the reply stays out of the conversation and the LLM's history.
        metadata: the client's, shown with the response.
    """

    turn: int
    user_text: str | None = None
    out_of_band: bool = False
    metadata: dict[str, Any] | None = None
    id: str = field(default_factory=lambda: _new_id("resp"))
    item_id: str = field(default_factory=lambda: _new_id("item"))
    state: State = State.QUEUED
    reason: str | None = None  # why it was cancelled: client_cancelled, turn_detected
    held: list[tuple[Any, bool]] = field(default_factory=list)  # (part, ends it) that came while queued
    transcript: list[str] = field(default_factory=list)
    audio_s: float = 0.0
    calls: list[dict[str, Any]] = field(default_factory=list)
    chunks: dict[int, str] = field(default_factory=dict)  # piece number in the turn -> its text
    chunk_audio: dict[int, float] = field(default_factory=dict)  # piece number -> seconds of audio sent of it
    resampler: Any = None  # its audio at the client's rate: one stream for the whole reply (no clicks)
    visemes: Any = None  # a VisemeTrack when the session asked for visemes as the response opened
    text_only: bool = False  # output_modalities ["text"]: text events, no audio
    usage: Usage | None = None  # the tokens the LLM counted for it (None: none came, e.g. llm=echo)

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def heard(self, seconds: float) -> str:
        """The words of the reply whose audio lies within its first ``seconds`` (a client's truncation).

        Pieces of text follow each other in their audio; the piece the cut falls in keeps the share of its words
        that its audio before the cut has of all its audio.
        """
        kept, left = [], seconds
        for chunk, duration in sorted(self.chunk_audio.items()):
            words = self.chunks.get(chunk, "").split()
            if left >= duration - 1e-3:
                kept += words
                left -= duration
                continue
            kept += words[:round(len(words) * max(left, 0.0) / duration)] if duration > 0 else []
            break
        return " ".join(kept)


@dataclass(frozen=True)
class Opened:
    """``response`` is now the one being sent (``response.created``)."""

    response: Response


@dataclass(frozen=True)
class Output:
    """``part`` (a piece of reply text, audio, a tool call) goes out as part of ``response``."""

    response: Response
    part: Any


@dataclass(frozen=True)
class Finished:
    """``response`` ended in ``response.state``; ``announced`` is False when the client never heard of it."""

    response: Response
    announced: bool


Step = Opened | Output | Finished


class ResponseQueue:
    """The session's responses, oldest first; the first unfinished one is the only one that may be active."""

    def __init__(self) -> None:
        self._queue: deque[Response] = deque()
        self._by_turn: dict[int, Response] = {}  # each turn's newest response
        self.counts: Counter[State] = Counter()  # announced responses by how they ended

    # ------------------------------------------------------------------ what the handlers ask
    @property
    def busy(self) -> bool:
        """A response is being sent or waits: a client's ``response.create`` must wait for its end."""
        return any(not response.finished for response in self._queue)

    @property
    def active(self) -> Response | None:
        return next((r for r in self._queue if r.state is State.ACTIVE), None)

    def newest_open_turn(self) -> int | None:
        """The turn of the newest unfinished response (the LLM works on it), or None."""
        open_ones = [r for r in self._queue if not r.finished]
        return open_ones[-1].turn if open_ones else None

    # ------------------------------------------------------------------ moves
    def add(self, turn: int, user_text: str | None = None, out_of_band: bool = False,
            metadata: dict[str, Any] | None = None, text_only: bool = False) -> list[Step]:
        """A new response for ``turn`` (its transcript, or tool outputs that continue it); opens when it can."""
        response = Response(turn, user_text, out_of_band, metadata)
        response.text_only = text_only
        self._by_turn[turn] = response
        self._queue.append(response)
        return self._open_next()

    def output(self, turn: int, part: Any) -> list[Step]:
        """A piece of the reply to ``turn``: sent if its response is active, held if queued, else dropped."""
        return self._deliver(turn, part, ends=False)

    def complete(self, turn: int, part: Any = None) -> list[Step]:
        """The reply to ``turn`` is over (after ``part``, e.g. the tool call that ends it, when given)."""
        return self._deliver(turn, part, ends=True)

    def charge(self, turn: int, usage: Usage) -> None:
        """Tokens the LLM spent on ``turn``: they count in its newest response unless that one is finished (its
        ``response.done`` is out; the session's total still has them)."""
        response = self._by_turn.get(turn)
        if response is not None and not response.finished:
            response.usage = usage if response.usage is None else response.usage + usage

    def cancel(self, turn: int, reason: str) -> list[Step]:
        """The client cancelled the response to ``turn`` (``response.cancel``)."""
        response = self._by_turn.get(turn)
        return [] if response is None else self._finish(response, "cancel", reason)

    def barge_in(self, turn: int) -> list[Step]:
        """The user started ``turn``: every unfinished response to an earlier turn is cancelled."""
        steps: list[Step] = []
        for response in list(self._queue):
            if response.turn < turn and not response.finished:
                steps += self._finish(response, "cancel", "turn_detected")
        return steps

    def fail_all(self) -> list[Step]:
        """The graph stopped: nothing more will come for any response."""
        steps: list[Step] = []
        for response in list(self._queue):
            steps += self._finish(response, "fail", None)
        return steps

    # ------------------------------------------------------------------ inside
    def _move(self, response: Response, move: str) -> bool:
        target = MOVES.get((response.state, move))
        if target is None:
            return False
        response.state = target
        return True

    def _deliver(self, turn: int, part: Any, ends: bool) -> list[Step]:
        response = self._by_turn.get(turn)
        if response is None:
            return []  # a turn without a reply (no words)
        return self._deliver_to(response, part, ends)

    def _deliver_to(self, response: Response, part: Any, ends: bool) -> list[Step]:
        if response.finished:
            return []  # cancelled, or over: nothing more for it
        if response.state is State.QUEUED:
            response.held.append((part, ends))
            return []
        steps: list[Step] = [] if part is None else [Output(response, part)]
        return steps + (self._finish(response, "complete", None) if ends else [])

    def _finish(self, response: Response, move: str, reason: str | None) -> list[Step]:
        announced = response.state is State.ACTIVE
        if not self._move(response, move):
            return []
        response.reason = reason
        if announced:
            self.counts[response.state] += 1
        return [Finished(response, announced), *self._open_next()]

    def _open_next(self) -> list[Step]:
        while self._queue and self._queue[0].finished:
            self._queue.popleft()
        if not self._queue or not self._move(self._queue[0], "open"):
            return []  # empty, or the first one is already active
        response = self._queue[0]
        steps: list[Step] = [Opened(response)]
        held, response.held = response.held, []
        for part, ends in held:  # after a held end, the rest is dropped (the response is finished)
            steps += self._deliver_to(response, part, ends)
        return steps

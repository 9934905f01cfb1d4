"""What a session's writer sends, as typed messages, and the one way to queue them: :meth:`Outbox.put`.

The handlers (event loop), the graph's threads (through :class:`GraphObserver`) and the tool calls (the
LLM's thread) all put messages here; one writer takes them in order and has them translated into server
events, so events keep their order whoever produced them.
"""
from __future__ import annotations

import asyncio
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from s2s.graph import RunResult
from s2s.messages import (Data, Message, Metric, ReplyAudio, ReplyText, SpeechSegment, SpeechStarted,
                          Transcript, TranscriptSoFar, TurnEnd)
from s2s.metrics import Recorder
from s2s.server.protocol import ItemRequest
from s2s.turn_gate import CONFIRMED, DISCARDED, OPENED, Holding, TurnEvent, TurnGate
from s2s.usage import Usage, from_metric


@dataclass(frozen=True)
class Send:
    """A server event that is ready as it is (``session.updated``, ``conversation.item.created``, ``error``)."""

    event: dict[str, Any]


@dataclass(frozen=True)
class UserStarted:
    """The VAD heard the user start ``turn``."""

    turn: int


@dataclass(frozen=True)
class UserStopped:
    """The user's ``turn`` ended at ``end_s`` on the input clock."""

    turn: int
    end_s: float
    resumes: int | None = None  # the ended turn it went on from (SpeechSegment.resumes): that one's items go


@dataclass(frozen=True)
class UserPartial:
    """An interim transcript of ``turn`` while the user still speaks (the utterance so far)."""

    turn: int
    text: str


@dataclass(frozen=True)
class UserHeard:
    """The transcript of ``turn`` (spoken, or typed and handed to the LLM): its response is made now."""

    turn: int
    text: str


@dataclass(frozen=True)
class UserNotHeard:
    """The STT failed on ``turn`` (it gets no transcript and no reply)."""

    turn: int


@dataclass(frozen=True)
class UserIdle:
    """The user stayed silent ``timeout_s`` after a reply (``idle_timeout_ms``): ``turn`` is that silence, committed
    at ``end_s`` on the input clock, and a response prompts them."""

    turn: int
    end_s: float
    timeout_s: float


@dataclass(frozen=True)
class ReplyWords:
    """A piece of the reply's text: the ``chunk``-th the LLM handed the TTS in its turn."""

    turn: int
    text: str
    chunk: int = -1


@dataclass(frozen=True)
class ReplySound:
    """A block of reply audio, at the TTS's rate, made of the ``chunk``-th piece of text of its turn."""

    audio: ReplyAudio
    chunk: int = -1


@dataclass(frozen=True)
class ItemAdded:
    """A client's item (typed text, a tool's output, a system or assistant message) joins the conversation."""

    item: dict[str, Any]
    turn: int | None = None  # a system or assistant message: its place in the history


@dataclass(frozen=True)
class ItemsAnswered:
    """The typed items ``item_ids`` make up the user's side of ``turn`` (``response.create`` answered them)."""

    turn: int
    item_ids: tuple[str, ...]


@dataclass(frozen=True)
class ItemAsked:
    """``conversation.item.retrieve``, ``.delete`` or ``.truncate``: answered in order with everything else."""

    request: ItemRequest


@dataclass(frozen=True)
class Committed:
    """The client committed its input buffer (manual turns): ``turn`` is on its way to the STT."""

    turn: int


@dataclass(frozen=True)
class TokensUsed:
    """The LLM counted tokens for ``turn`` (one count of one round): they go to the response being made of it."""

    turn: int
    usage: Usage


@dataclass(frozen=True)
class ReplyOver:
    """Everything of the reply to ``turn`` reached the sink."""

    turn: int


@dataclass(frozen=True)
class ToolCalled:
    """The LLM called a client tool; ``arguments`` is the JSON text the client gets."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolOutputs:
    """The client's outputs for calls the LLM waits on: the turn goes on, as a new response."""

    outputs: tuple[tuple[str, str], ...]  # (call_id, output)


@dataclass(frozen=True)
class CancelReply:
    """End the response to ``turn`` as cancelled (``response.cancel``)."""

    turn: int
    reason: str


@dataclass(frozen=True)
class GraphEnded:
    """The session's graph stopped (it failed, or the input ended)."""

    result: RunResult


@dataclass(frozen=True)
class Close:
    """The session is over: the writer stops."""


OutboxMessage = (Send | UserStarted | UserStopped | UserPartial | UserHeard | UserNotHeard | UserIdle | ReplyWords
                 | ReplySound | ReplyOver | ToolCalled | ToolOutputs | CancelReply | GraphEnded | ItemAdded
                 | ItemsAnswered | ItemAsked | Committed | TokensUsed | Close)


class Outbox:
    """The writer's queue; :meth:`put` is callable from any thread and keeps the order of the calls.

    It holds at most ``limit`` messages: a client that does not read (its socket full, the writer waiting)
    must not grow the server's memory. The first message over it calls ``on_overflow`` (in the loop) and is
    dropped, as is every later one but :class:`Close`.

    Args:
        loop: the event loop the writer runs in.
        limit: messages waiting for the writer, at most (None: no limit).
        on_overflow: called once, in the loop, when a message finds the queue full.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int | None = None,
                 on_overflow: Callable[[], None] | None = None) -> None:
        self._loop, self.limit, self._on_overflow = loop, limit, on_overflow
        self._queue: asyncio.Queue[OutboxMessage] = asyncio.Queue()
        self.overflowed = False

    def put(self, message: OutboxMessage) -> None:
        try:
            self._loop.call_soon_threadsafe(self._put, message)
        except RuntimeError:  # the event loop is gone (server stopping): nothing left to tell
            pass

    def _put(self, message: OutboxMessage) -> None:
        room = self.limit is None or self._queue.qsize() < self.limit
        if room and not self.overflowed or isinstance(message, Close):
            self._queue.put_nowait(message)
        elif not self.overflowed:
            self.overflowed = True
            if self._on_overflow is not None:
                self._on_overflow()

    async def get(self) -> OutboxMessage:
        return await self._queue.get()


class GraphObserver:
    """The session's view of its graph: every figure goes to the Recorder, what the client hears of to the outbox.

    A speculative turn's messages wait until the graph's turn gate confirms the turn, and are dropped if it
    discards it: the client never hears of an attempt that did not stand. The gate tells us early (before it
    delivers the turn's held audio to the sink), so the turn's transcript and text go out before its audio.

    Each piece of reply text is numbered in its turn as the LLM hands it on, and each block of audio the TTS
    makes carries the number of the piece it was speaking (:meth:`chunk_of`), so a client's truncation at an
    audio position maps onto the words that had been heard.

    Args:
        recorder: the session's metrics.
        outbox: where the messages go.
        vad_stage: the VAD's name (control messages pass every stage; they count once, from it).
        last_stage: the sink's name (a turn's reply is over when its TurnEnd leaves the sink).
        tts_stage: the TTS's name (the stage that turns the pieces of text into audio).
    """

    def __init__(self, recorder: Recorder, outbox: Outbox, vad_stage: str, last_stage: str,
                 tts_stage: str = "tts", heard: Callable[[int, str], None] | None = None) -> None:
        self.recorder, self.outbox, self.vad_stage, self.last_stage = recorder, outbox, vad_stage, last_stage
        self.heard = heard  # an incremental STT's words so far (TranscriptSoFar) go there
        self.tts_stage = tts_stage
        self._pending: Holding[OutboxMessage] = Holding()  # speculative turns: messages wait for confirmation
        self._dropped: set[int] = set()  # discarded attempts: late news of them goes nowhere
        self._lock = threading.Lock()
        self._written: Counter[int] = Counter()  # pieces of text the LLM handed on, per turn
        self._voiced: Counter[int] = Counter()  # pieces the TTS took, per turn
        self._speaking = -1  # the piece the TTS works on
        self._chunks: weakref.WeakKeyDictionary[ReplyAudio, int] = weakref.WeakKeyDictionary()

    def chunk_of(self, audio: ReplyAudio) -> int:
        """The number of the piece of text ``audio`` speaks (-1: unknown), from the sink's thread."""
        with self._lock:
            return self._chunks.pop(audio, -1)

    def watch(self, gate: TurnGate) -> None:
        """Follow the graph's turn gate (called once by the graph): the Recorder and the outbox obey it."""
        self.recorder.watch(gate)
        gate.listen(self._on_turn, early=True)

    def _on_turn(self, event: TurnEvent) -> None:
        """The gate opened, confirmed or discarded a speculative turn (under its lock: never call it here)."""
        with self._lock:
            if event.kind == OPENED:
                self._pending.open(event.turn)
                return
            if event.kind == DISCARDED:
                self._dropped.add(event.turn)
            held = self._pending.release(event.turn) or []
            if event.kind == CONFIRMED:  # under our lock: nothing newer of the turn overtakes them
                for item in held:
                    self.outbox.put(item)

    def _put(self, turn: int, message: OutboxMessage) -> None:
        """Send now, once ``turn`` is confirmed, or never (a discarded attempt)."""
        with self._lock:
            if not self._pending.hold(turn, message) and turn not in self._dropped:
                self.outbox.put(message)

    def on_input(self, stage: str, message: Data, now: float) -> None:
        self.recorder.on_input(stage, message, now)
        if stage == self.tts_stage and isinstance(message, ReplyText):
            self._speaking = self._voiced[message.turn]
            self._voiced[message.turn] += 1

    def on_done(self, stage: str, message: Data, now: float) -> None:
        self.recorder.on_done(stage, message, now)

    def on_output(self, stage: str, message: Message, now: float) -> None:
        self.recorder.on_output(stage, message, now)
        if isinstance(message, ReplyAudio) and stage == self.tts_stage:
            with self._lock:
                self._chunks[message] = self._speaking
        if isinstance(message, SpeechStarted) and stage == self.vad_stage:
            self.outbox.put(UserStarted(message.turn))
        elif isinstance(message, SpeechSegment):
            self._put(message.turn, UserStopped(message.turn, message.end_s, message.resumes))
        elif isinstance(message, Transcript):
            self._put(message.turn, UserHeard(message.turn, message.text))
        elif isinstance(message, TranscriptSoFar) and self.heard is not None:
            self.heard(message.turn, message.text)
        elif isinstance(message, ReplyText):
            chunk = self._written[message.turn]
            self._written[message.turn] += 1
            self._put(message.turn, ReplyWords(message.turn, message.text, chunk))
        elif isinstance(message, TurnEnd) and stage == self.last_stage:
            self.outbox.put(ReplyOver(message.turn))

    def on_metric(self, stage: str, metric: Metric) -> None:
        self.recorder.on_metric(stage, metric)
        if (usage := from_metric(metric)) is not None:
            self._put(metric.turn, TokensUsed(metric.turn, usage))
        elif metric.name == "stt_error":
            self._put(metric.turn, UserNotHeard(metric.turn))

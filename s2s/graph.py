"""The runner: a chain of stages, one thread each, joined by queues it owns.

Messages flow source -> ... -> sink. Control messages pass through stages without reaching ``process``;
``EndOfStream`` makes each stage flush and then ends its thread, so the graph drains in order. A stage that
raises, Ctrl-C or SIGTERM stop every thread within ``stop_timeout_s``; ``close()`` then runs on every stage,
so files being written are finalised.
"""
from __future__ import annotations

import logging
import queue
import signal
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from s2s.messages import (AudioChunk, Control, Data, EndOfStream, Message, Metric, Progress, ReplyAudio, ReplyText,
                          SpeechSegment, Transcript, TurnDiscarded, TurnEnd)
from s2s import turn_order
from s2s.stage import Source, Stage
from s2s.turn_gate import TurnGate

log = logging.getLogger(__name__)

_POLL_S = 0.05  # how often an idle thread looks at the stop flag


class Observer(Protocol):
    """Sees every message a stage starts, finishes or emits (thread-safe implementations only)."""

    def on_input(self, stage: str, message: Data, now: float) -> None: ...

    def on_done(self, stage: str, message: Data, now: float) -> None: ...

    def on_output(self, stage: str, message: Message, now: float) -> None: ...

    def on_metric(self, stage: str, metric: Metric) -> None: ...

    # optional: ``watch(gate: TurnGate)`` is called once with the graph's turn gate, to listen to its events


class NullObserver:
    def on_input(self, stage: str, message: Data, now: float) -> None: ...

    def on_done(self, stage: str, message: Data, now: float) -> None: ...

    def on_output(self, stage: str, message: Message, now: float) -> None: ...

    def on_metric(self, stage: str, metric: Metric) -> None: ...

    def watch(self, gate: TurnGate) -> None: ...


# what a stage makes when it does not say (``emits``): the next step of the pipeline after what it accepts
_NEXT: dict[type[Data], type[Data]] = {AudioChunk: SpeechSegment, SpeechSegment: Transcript, Transcript: ReplyText,
                                       ReplyText: ReplyAudio}


def makes(stage: Stage) -> tuple[type[Data], ...]:
    """The data types ``stage`` produces: its ``emits``, or else what follows what it ``accepts``."""
    return stage.emits or tuple(_NEXT[kind] for kind in stage.accepts if kind in _NEXT)


def maker(stages: list[tuple[str, Stage]], kinds: tuple[type[Data], ...]) -> int | None:
    """The index of the first stage between the source and the sink that makes one of ``kinds``, or None."""
    return next((index for index in range(1, len(stages) - 1) if set(makes(stages[index][1])) & set(kinds)), None)


@dataclass
class StageFailure:
    stage: str
    error: BaseException
    traceback: str

    def __str__(self) -> str:
        return f"stage '{self.stage}' failed: {type(self.error).__name__}: {self.error}"


class StageSetupError(RuntimeError):
    """A stage's ``setup()`` failed: names the stage and keeps the cause."""

    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(f"stage '{stage}' could not start: {error}")
        self.stage, self.error = stage, error


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM arrived; ``exit_code`` is the shell's 128 + signal number."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


@dataclass
class RunResult:
    status: str  # completed | failed | interrupted
    failure: StageFailure | None = None
    interrupt_code: int = 130  # 130 after Ctrl-C, 143 after SIGTERM
    stuck: list[str] = field(default_factory=list)  # stage threads still inside a library call at the end

    @property
    def exit_code(self) -> int:
        return {"completed": 0, "failed": 1, "interrupted": self.interrupt_code}[self.status]


def set_up(name: str, stage: Stage, warm_up: bool) -> float:
    """``setup()`` and, if asked, ``warm_up()`` one stage; returns the seconds taken. A failure closes the stage
    and raises :class:`StageSetupError` naming it."""
    start = time.perf_counter()
    try:
        stage.setup()
        if warm_up:
            stage.warm_up()
    except Exception as error:
        stage.close()
        raise StageSetupError(name, error) from error
    return time.perf_counter() - start


class Graph:
    """A linear chain of named stages; the first must be a :class:`Source`."""

    def __init__(self, stages: list[tuple[str, Stage]], observer: Observer | None = None, *,
                 barge_in: bool = False, half_duplex: bool | None = None, stop_timeout_s: float = 2.0,
                 first_audio_wait_s: float = 0.0, wanted: tuple[type[Message], ...] = ()) -> None:
        if not stages or not isinstance(stages[0][1], Source):
            raise ValueError("a graph starts with a Source stage")
        self.stages = stages
        self._sink = len(stages) - 1  # the end of the chain, whatever it consumes
        self.observer = observer or NullObserver()
        self.stop_timeout_s = stop_timeout_s
        self._queues: list[queue.Queue[Message]] = [queue.Queue() for _ in stages[1:]]
        # speculation, confirmation, discards, barge-in and half duplex (ignore a live source from the end of
        # the user's turn until the reply has played): work starts early, nothing reaches the sink too early
        self.turns = TurnGate(self._queues[-1].put if self._queues else lambda message: None, barge_in=barge_in,
                              half_duplex=(stages[0][1].live and not barge_in) if half_duplex is None else half_duplex)
        watch = getattr(self.observer, "watch", None)
        if callable(watch):
            watch(self.turns)
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._failure: StageFailure | None = None
        self._failure_lock = threading.Lock()
        # first audio first: the stage feeding the voice (the LLM before the TTS) hands on a turn's first piece,
        # then waits until the voice has made that piece into audio (at most this long), so the two do not share
        # the CPU while the user waits for the first audio; 0 turns it off. Roles come from what stages make.
        self.first_audio_wait_s = first_audio_wait_s
        self._voice = maker(stages, (ReplyAudio,))
        self._writer = None if self._voice is None else maker(stages, stages[self._voice][1].accepts or (ReplyText,))
        self._first_out: dict[int, threading.Event] = {}
        self._first_out_lock = threading.Lock()
        # the model stages' calls take turns with other pipelines' (a server's, when it orders them): s2s.turn_order
        self._ranks = turn_order.Ranks()
        self._ordered = {index for index in range(1, self._sink) if stages[index][1].on_cores
                         and set(makes(stages[index][1])) & {Transcript, ReplyText, ReplyAudio}}
        # feedback: a control that a stage ``takes`` (the VAD a TurnVerdict) goes back to it from whichever later
        # stage emits it; each stage is told what is wanted, so none makes feedback that nobody reads
        self._takers = {kind: index for index, (_, stage) in enumerate(stages) if index > 0 for kind in stage.takes}
        for index, (_, stage) in enumerate(stages):
            asked = stages[index + 1][1].asks if index + 1 < len(stages) else ()
            stage.wanted = frozenset([*self._takers, *asked, *wanted])  # wanted: what the observer reads
        self.barge_in = barge_in

    @property
    def barge_in(self) -> bool:
        return self.turns.barge_in

    @barge_in.setter
    def barge_in(self, value: bool) -> None:  # the realtime server turns it on and off per session
        self.turns.barge_in = value
        for _, stage in self.stages:  # the VAD resumes a turn the speaker goes on from only with it
            stage.barge_in = value

    @property
    def half_duplex(self) -> bool:
        return self.turns.half_duplex

    # ------------------------------------------------------------------ lifecycle
    def setup(self, warm_up: bool = True) -> dict[str, float]:
        """Set up (and warm up) stages, I/O first: a missing sound card fails before any model loads."""
        order = sorted(range(len(self.stages)), key=lambda i: 0 if i in (0, self._sink) else 1)
        timings: dict[str, float] = {}
        for index in order:
            name, stage = self.stages[index]
            timings[name] = set_up(name, stage, warm_up)
            log.info("set up %s (%s) in %.2f s", name, type(stage).__name__, timings[name])
        return timings

    @property
    def live(self) -> bool:
        """The input is live (a microphone): someone is waiting to speak."""
        return self.stages[0][1].live  # type: ignore[attr-defined]

    def close(self) -> None:
        """Close every stage whose thread has ended (a stage still inside a library call keeps its model)."""
        busy = {thread.name for thread in self._threads if thread.is_alive()}
        for name, stage in self.stages:
            if f"s2s-{name}" in busy:
                log.warning("not closing %s: it is still inside a library call", name)
                continue
            try:
                stage.close()
            except Exception as error:  # closing must reach every stage
                log.warning("closing %s failed: %s: %s", name, type(error).__name__, error)

    def stop(self) -> None:
        self._stop.set()

    def inject(self, before: str, message: Message) -> None:
        """Hand ``message`` to stage ``before`` as if the stage ahead of it had emitted it (thread-safe).

        The realtime server uses it for typed turns: a ``Transcript`` injected before the LLM gets a reply
        like a spoken one. Observers see it as an output of the stage ahead, so metrics and barge-in apply.
        """
        index = next((i for i, (name, _) in enumerate(self.stages) if name == before), None)
        if not index:  # None, or the source: nothing comes before it
            raise ValueError(f"no stage '{before}' after the source; stages: {[n for n, _ in self.stages]}")
        self._emit(index - 1, message)

    def cancel_turns_below(self, turn: int) -> None:
        """Drop everything still on its way for turns below ``turn``, as barge-in does (thread-safe).

        Stages working on such a turn have their ``process`` generator closed at its next output; the
        realtime server calls it for ``response.cancel``.
        """
        self.turns.cancel_below(turn)

    def run(self) -> RunResult:
        """Run until the input ends, a stage fails, or Ctrl-C; never raises for stage errors."""
        threads = self._threads = [
            threading.Thread(target=self._guard, args=(index,), name=f"s2s-{name}", daemon=True)
            for index, (name, _) in enumerate(self.stages)]
        for thread in threads:
            thread.start()
        interrupt: KeyboardInterrupt | None = None
        try:
            self._wait(threads)
        except KeyboardInterrupt as error:
            interrupt = error
            log.warning("interrupted: stopping the graph")
            self._stop.set()
            self._wait(threads, deadline=time.monotonic() + self.stop_timeout_s)
        stuck = [thread.name.removeprefix("s2s-") for thread in threads if thread.is_alive()]
        if self._failure:
            return RunResult("failed", self._failure, stuck=stuck)
        if interrupt is not None:
            code = interrupt.exit_code if isinstance(interrupt, Interrupted) else 130
            return RunResult("interrupted", interrupt_code=code, stuck=stuck)
        return RunResult("completed", stuck=stuck)

    def _wait(self, threads: list[threading.Thread], deadline: float | None = None) -> None:
        while any(thread.is_alive() for thread in threads):
            if self._stop.is_set() and deadline is None:
                deadline = time.monotonic() + self.stop_timeout_s
            if deadline is not None and time.monotonic() > deadline:
                stuck = [thread.name for thread in threads if thread.is_alive()]
                log.warning("stopped waiting for %s (still busy inside a library call)", ", ".join(stuck))
                return
            for thread in threads:
                thread.join(_POLL_S / len(threads))

    # ------------------------------------------------------------------ threads
    def _guard(self, index: int) -> None:
        name = self.stages[index][0]
        try:
            self._run_source() if index == 0 else self._run_stage(index)
        except BaseException as error:  # noqa: BLE001 - any failure stops the whole graph
            with self._failure_lock:
                if self._failure is None:
                    self._failure = StageFailure(name, error, traceback.format_exc())
            self._stop.set()

    def _run_source(self) -> None:
        name, source = self.stages[0]
        assert isinstance(source, Source)
        stream = source.stream()
        try:
            for message in stream:
                if self._stop.is_set():
                    return
                if not self.turns.deaf:
                    self._emit(0, message)
                elif isinstance(message, AudioChunk):  # heard as silence: the VAD's clock keeps the source's time
                    self._emit(0, AudioChunk(message.samples * 0, message.sample_rate))
        finally:
            stream.close()
        self._emit(0, EndOfStream())

    def _run_stage(self, index: int) -> None:
        name, stage = self.stages[index]
        inbox = self._queues[index - 1]
        while not self._stop.is_set():
            try:
                message = inbox.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if isinstance(message, Progress) and not inbox.empty():
                continue  # what waits behind it (a newer one, the turn's segment) holds all of it
            if isinstance(message, EndOfStream):
                self._drain(index, stage.flush())
                self._emit(index, message)
                return
            if isinstance(message, TurnEnd) and not self._stale(message):
                self._drain(index, stage.end_turn(message.turn))
            if isinstance(message, TurnDiscarded):
                stage.discard(message.turn)
            if stage.takes and isinstance(message, stage.takes):  # feedback from a later stage: it ends here
                self._drain(index, stage.steer(message))
                continue
            if isinstance(message, Control):
                self._emit(index, message, forwarded=True)
                continue
            if self._stale(message):
                continue
            if stage.accepts and not isinstance(message, stage.accepts):
                raise TypeError(f"{type(stage).__name__} accepts {', '.join(k.__name__ for k in stage.accepts)}, "
                                f"not {type(message).__name__}: check the pipeline order")
            self.observer.on_input(name, message, time.perf_counter())
            outputs = stage.process(message)
            if index in self._ordered:
                outputs = turn_order.ordered(outputs, lambda seen=message: self._ranks.of(seen))
            self._drain(index, outputs, message)
            self.observer.on_done(name, message, time.perf_counter())
            if index == self._voice:
                self._piece_made(message)  # the piece is done, even if it made no output

    def _drain(self, index: int, outputs: Iterator[Message], source: Data | None = None) -> None:
        """Forward a stage's outputs as they come; stop early (closing the generator) on stop or barge-in."""
        yields = source is not None and self.first_audio_wait_s > 0 and index == self._writer
        try:
            for output in outputs:
                if self._stop.is_set() or (source is not None and self._stale(source)):
                    return
                self._emit(index, output)
                if yields and isinstance(output, Data) and isinstance(turn := getattr(output, "turn", None), int):
                    yields = False  # only the turn's first piece waits
                    self._wait_first_output(turn, source)
        finally:
            close = getattr(outputs, "close", None)  # generators stop their backend in `finally`
            if close:
                close()

    def _first_output(self, turn: int) -> threading.Event:
        with self._first_out_lock:
            if turn not in self._first_out:
                for old in [key for key in self._first_out if key < turn - 8]:  # bounded: recent turns only
                    del self._first_out[old]
                self._first_out[turn] = threading.Event()
            return self._first_out[turn]

    def _piece_made(self, message: Message) -> None:
        """The voice made output of, or finished, a piece of ``message``'s turn: its feeder goes on."""
        turn = getattr(message, "turn", None)
        if not isinstance(turn, int):
            return
        self._ranks.spoke(turn)  # the rest of its reply waits behind other turns' first audio
        if self.first_audio_wait_s > 0:
            self._first_output(turn).set()

    def _wait_first_output(self, turn: int, source: Data) -> None:
        """Before the stage makes more of ``turn``, let the next stage turn the first piece into output."""
        made = self._first_output(turn)
        deadline = time.monotonic() + self.first_audio_wait_s
        while not made.wait(_POLL_S):
            if self._stop.is_set() or self._stale(source) or time.monotonic() > deadline:
                return

    def _stale(self, message: Message) -> bool:
        return self.turns.is_stale(getattr(message, "turn", None))

    def _emit(self, index: int, message: Message, forwarded: bool = False) -> None:
        """Hand ``message`` on; ``forwarded`` controls were acted on when their stage first emitted them."""
        name = self.stages[index][0]
        if isinstance(message, Metric):
            self.observer.on_metric(name, message)
            return
        taker = self._takers.get(type(message))
        if taker is not None and taker <= index:  # feedback goes back upstream, into the taker's inbox
            self.observer.on_output(name, message, time.perf_counter())
            self._queues[taker - 1].put(message)
            return
        if not forwarded:  # e.g. a TurnConfirmed passed on after the reply must not make the mic deaf again
            self.turns.observe(message)  # first: observers see a message in the light of what it did to its turn
        self.observer.on_output(name, message, time.perf_counter())
        if isinstance(message, TurnEnd) and index == self._sink:
            self.turns.played(message.turn)
        if index + 1 == self._sink:  # the gate lets it through to the sink, or holds it
            if isinstance(message, Data) and index == self._voice:
                self._piece_made(message)
            self.turns.admit(message)
        elif index < self._sink:
            self._queues[index].put(message)

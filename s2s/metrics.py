"""Per-turn figures (voice-to-voice, STT, LLM, TTS) gathered from the messages the runner sees.

Stages do not time themselves: the runner reports when each stage starts and finishes a message and when it
emits one, and the roles follow from message types (whoever emits a Transcript is the STT, and so on). Which
turns stand is the turn gate's to say (s2s/turn_gate.py): the Recorder listens to it.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from s2s import audio
from s2s.platform import machine_info, peak_memory_mb
from s2s.messages import (Data, Message, Metric, ReplyAudio, ReplyText, SpeechSegment, Transcript,
                          TurnConfirmed, TurnEnd)
from s2s.turn_gate import CONFIRMED, DISCARDED, OPENED, Holding, TurnEvent, TurnGate

log = logging.getLogger("s2s.metrics")

FIGURES = ("voice_to_voice_s", "endpoint_s", "stt_s", "stt_after_s", "llm_first_token_s", "llm_first_sentence_s",
           "llm_total_s", "tts_first_audio_s", "held_s", "tts_rtf")
TEXT_KEYS = ("user", "assistant", "first_chunk")  # what a turn's record holds of its words


@dataclass
class Turn:
    """Timings (perf_counter seconds) and text of one user turn."""

    turn: int
    user: str = ""
    assistant: list[str] = field(default_factory=list)
    language: str | None = None
    user_audio_s: float | None = None
    reply_audio_s: float = 0.0
    complete: bool = False
    resumes: int | None = None  # the turn it went on from: its words hold that turn's (vad.resume_ms)
    # on the input stream's clock (0 = the first input sample)
    speech_end_at_s: float | None = None  # the last voiced frame
    closed_at_s: float | None = None  # the VAD let the segment go (work on the turn starts)
    confirmed_at_s: float | None = None  # a speculative turn's silence lasted
    speculative: bool = False  # the turn gate holds it: not confirmed yet
    anchors: list[tuple[float, float]] = field(default_factory=list)  # (input clock, perf_counter) pairs
    # perf_counter times
    stt_start: float | None = None
    heard_by: str | None = None  # the stage that took the utterance (the LLM itself with stt=none)
    segment_out: float | None = None  # the VAD let the segment go (the STT may still be busy with a pass)
    stt_end: float | None = None
    llm_start: float | None = None
    llm_first_sentence: float | None = None
    llm_end: float | None = None
    tts_start: float | None = None
    tts_first_audio: float | None = None
    tts_end: float | None = None  # the TTS finished the turn's last piece of text
    tts_busy_s: float = 0.0
    first_reply_at_sink: float | None = None
    lead_silence_s: float = 0.0  # silence at the start of that first block: the user hears sound this much later
    finished_at: float | None = None  # its TurnEnd left the last stage
    reported: dict[str, float] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # metrics with details: tool calls, LLM errors

    def figures(self) -> dict[str, float | None]:
        def span(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round(b - a, 4)

        rtf = round(self.tts_busy_s / self.reply_audio_s, 4) if self.reply_audio_s else None
        first_audio_at = self.first_audio_at_s()
        return {
            "speech_end_at_s": None if self.speech_end_at_s is None else round(self.speech_end_at_s, 4),
            "first_audio_at_s": None if first_audio_at is None else round(first_audio_at, 4),
            # from the end of speech, endpointing included, to the first reply audio at the sink
            "voice_to_voice_s": span(self.speech_end_at_s, first_audio_at),
            "endpoint_s": span(self.speech_end_at_s, self.closed_at_s),  # silence waited before work started
            "confirm_s": span(self.speech_end_at_s, self.confirmed_at_s),  # ... and before a reply may play
            "stt_s": span(self.stt_start, self.stt_end),
            # from the VAD letting the segment go to the transcript: the STT's time after the end of speech,
            # waiting for a pass over the speech so far included
            "stt_after_s": span(self.segment_out, self.stt_end),
            "llm_first_token_s": round(self.reported["llm_first_token_s"], 4)
            if "llm_first_token_s" in self.reported else None,
            "llm_first_sentence_s": span(self.llm_start, self.llm_first_sentence),
            "llm_total_s": span(self.llm_start, self.llm_end),
            "tts_first_audio_s": span(self.tts_start, self.tts_first_audio),
            "held_s": span(self.tts_first_audio, self.first_reply_at_sink),  # ready, waiting for confirmation
            "tts_rtf": rtf,  # synthesis time / audio duration: below 1 is faster than real time
        }

    def first_audio_at_s(self) -> float | None:
        """When the first reply sound reached the sink (its block, plus any silence leading it), on the input clock.

        Wall time is mapped onto the input clock through each point where both are known (the VAD letting the
        segment go, the confirmation); the latest mapping wins, so a file read faster than real time still
        counts the silence that confirmed the turn. Under real-time pacing all mappings agree.
        """
        if self.first_reply_at_sink is None or not self.anchors:
            return None
        heard = self.first_reply_at_sink + self.lead_silence_s
        return max(at + (heard - wall) for at, wall in self.anchors)

    def record(self) -> dict[str, Any]:
        return {"turn": self.turn, "user": self.user, "assistant": " ".join(self.assistant),
                "first_chunk": self.assistant[0] if self.assistant else "",
                "language": self.language, "complete": self.complete,
                "user_audio_s": None if self.user_audio_s is None else round(self.user_audio_s, 3),
                "reply_audio_s": round(self.reply_audio_s, 3), "timings": self.figures(),
                "reported": {name: round(value, 4) for name, value in self.reported.items()},
                **({"resumes": self.resumes} if self.resumes is not None else {}),
                **({"events": self.events} if self.events else {})}


class TurnListener(Protocol):
    """Told of each turn once its record is final, and of the end (a tracer: :mod:`s2s.spans`)."""

    def turn_finished(self, turn: Turn, record: dict[str, Any]) -> None: ...

    def recording_finished(self, status: str, error: str | None) -> None: ...


class Recorder:
    """Observer that builds turn records and writes transcript.jsonl and metrics.json into ``output_dir``.

    transcript.jsonl gets one line per finished turn as soon as it finishes; metrics.json is rewritten
    (atomically) after each turn and at the end, so both stay valid if the run stops half-way.

    A speculative turn is held (no console line, no record) until the turn gate confirms it, and forgotten
    when the gate discards it. The graph hands the Recorder its gate (``watch``); an observer that does not
    pass it on leaves the Recorder its own gate, fed with the messages it sees. Listeners (``listen``) hear of
    confirmed turns only, so a discarded attempt reaches no trace either.

    With ``content=False`` (a server unless ``server.log_transcripts``: its users' words are theirs) no text
    leaves the Recorder: no transcript.jsonl, and the log lines, metrics.json and :meth:`records` carry the
    figures without the user's or the assistant's words.
    """

    def __init__(self, output_dir: str | Path, last_stage: str = "sink",
                 run_info: dict[str, Any] | None = None, console: bool = False, content: bool = True) -> None:
        self.output_dir = Path(output_dir)
        self.last_stage = last_stage  # a turn is finished when its TurnEnd leaves this stage
        self.content = content
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.transcript_path = self.output_dir / "transcript.jsonl"
        self.metrics_path = self.output_dir / "metrics.json"
        if content:
            self.transcript_path.write_text("")
        self.run_info = dict(run_info or {})
        self.turns: dict[int, Turn] = {}
        self.setup_s: dict[str, float] = {}
        self.status = "running"
        self.error: str | None = None
        self._tts_open: dict[int, float] = {}
        self.console = console  # print each heard turn and each reply sentence as it happens
        self._lock = threading.Lock()
        self._lines: Holding[str] = Holding()  # console lines of speculative turns, shown once confirmed
        self._gate = TurnGate()  # until a graph hands over its own: then the graph feeds it, not us
        self._own_gate = True
        self._gate.listen(self.on_turn)
        self._listeners: list[TurnListener] = []

    def listen(self, listener: TurnListener) -> None:
        """Tell ``listener`` of every turn whose record is final (outside the lock), then of the end."""
        self._listeners.append(listener)

    def watch(self, gate: TurnGate) -> None:
        """Follow ``gate`` (the graph's) instead of a gate of our own."""
        with self._lock:
            self._gate, self._own_gate = gate, False
        gate.listen(self.on_turn)

    def on_turn(self, event: TurnEvent) -> None:
        """The gate held, confirmed or dropped a turn."""
        with self._lock:
            if event.kind == DISCARDED:  # an attempt the user spoke over: it leaves no trace
                self.turns.pop(event.turn, None)
                self._lines.drop(event.turn)
            elif event.kind == OPENED:
                self._turn(event.turn).speculative = True
                self._lines.open(event.turn)
            elif event.kind == CONFIRMED:
                self._turn(event.turn).speculative = False
                for line in self._lines.release(event.turn) or []:
                    self._say(line)

    def _turn(self, number: int) -> Turn:
        if self._gate.is_discarded(number):
            return Turn(number, speculative=True)  # late news of a dropped attempt: recorded, shown nowhere
        return self.turns.setdefault(number, Turn(number))

    # --- Observer protocol -------------------------------------------------------------------------
    def on_input(self, stage: str, message: Data, now: float) -> None:
        with self._lock:
            if isinstance(message, SpeechSegment):
                turn = self._turn(message.turn)
                turn.stt_start, turn.heard_by = turn.stt_start or now, stage
            elif isinstance(message, Transcript):
                self._turn(message.turn).llm_start = now
            elif isinstance(message, ReplyText):
                turn = self._turn(message.turn)
                turn.tts_start = turn.tts_start or now
                self._tts_open[message.turn] = now
            elif isinstance(message, ReplyAudio):
                turn = self._turn(message.turn)
                if turn.first_reply_at_sink is None:
                    turn.first_reply_at_sink = now
                    bounds = audio.sound_bounds(message.samples)
                    turn.lead_silence_s = (bounds[0] if bounds else len(message.samples)) / message.sample_rate

    def on_done(self, stage: str, message: Data, now: float) -> None:
        with self._lock:
            if isinstance(message, Transcript):
                self._turn(message.turn).llm_end = now
            elif isinstance(message, SpeechSegment) and stage == (turn := self._turn(message.turn)).heard_by \
                    and turn.stt_end is None and turn.llm_start is not None:  # the LLM heard it (stt=none)
                turn.llm_end = now
            elif isinstance(message, ReplyText) and message.turn in self._tts_open:
                turn = self._turn(message.turn)
                turn.tts_busy_s += now - self._tts_open.pop(message.turn)
                turn.tts_end = now

    def on_output(self, stage: str, message: Message, now: float) -> None:
        finished: Turn | None = None
        if self._own_gate:  # outside our lock: the gate's events take it
            self._gate.observe(message)
        with self._lock:
            if isinstance(message, SpeechSegment):
                turn = self._turn(message.turn)
                turn.user_audio_s = message.end_s - message.start_s  # the input it spans (vad.gap_ms cuts pauses)
                turn.resumes = message.resumes
                turn.speech_end_at_s = message.end_s if message.speech_end_s is None else message.speech_end_s
                turn.closed_at_s = message.end_s if message.closed_s is None else message.closed_s
                turn.anchors.append((turn.closed_at_s, now))
                turn.segment_out = turn.segment_out or now
            elif isinstance(message, TurnConfirmed):
                turn = self._turn(message.turn)
                turn.confirmed_at_s = message.at_s
                turn.anchors.append((message.at_s, now))
            elif isinstance(message, Transcript):
                turn = self._turn(message.turn)
                turn.stt_end, turn.user, turn.language = now, message.text, message.language
                self._say(f"you: {message.text}", turn)
            elif isinstance(message, ReplyText):
                turn = self._turn(message.turn)
                if stage == turn.heard_by and turn.llm_start is None:  # no STT ran: its start was the LLM's
                    turn.llm_start, turn.stt_start = turn.stt_start, None
                turn.llm_first_sentence = turn.llm_first_sentence or now
                self._say(("assistant: " if not turn.assistant else "           ") + message.text, turn)
                turn.assistant.append(message.text)
            elif isinstance(message, ReplyAudio):
                turn = self._turn(message.turn)
                turn.tts_first_audio = turn.tts_first_audio or now
                turn.reply_audio_s += message.duration_s
            elif (isinstance(message, TurnEnd) and stage == self.last_stage
                  and not self._gate.is_discarded(message.turn)):  # a dropped attempt's end leaves no trace
                finished = self._turn(message.turn)
                finished.complete, finished.finished_at = True, now
                if not (finished.user or finished.assistant):  # e.g. a noise the STT found no words in
                    del self.turns[message.turn]
                    finished = None
        if finished:
            self._finish(finished)

    def on_metric(self, stage: str, metric: Metric) -> None:
        with self._lock:
            if "event" in metric.extra:  # a tool call and its result, an LLM error: kept in order, not a figure
                self._turn(metric.turn).events.append({"seconds": round(metric.value, 4), **metric.extra})
            elif metric.name.endswith("_tokens"):  # counts add up (each tool round's tokens); timings replace
                reported = self._turn(metric.turn).reported
                reported[metric.name] = reported.get(metric.name, 0) + metric.value
            else:
                self._turn(metric.turn).reported[metric.name] = metric.value

    # --- output -------------------------------------------------------------------------------------
    def _say(self, line: str, turn: Turn | None = None) -> None:
        """Show a line now, or once ``turn`` is confirmed (a speculative attempt may still be dropped)."""
        if turn is not None and turn.speculative:
            self._lines.hold(turn.turn, line)  # none held for a dropped attempt's late news: never shown
        elif self.console:
            print(line, flush=True)

    def _record(self, turn: Turn) -> dict[str, Any]:
        """The turn's record as it may be kept: without its words unless ``content``."""
        record = turn.record()
        if not self.content:
            for key in TEXT_KEYS:
                record.pop(key)
            record.pop("events", None)  # tool calls carry their arguments and results
        return record

    def records(self) -> list[dict[str, Any]]:
        """The records of the turns so far (with words, or not: ``content``), in order."""
        with self._lock:
            turns = sorted(self.turns.values(), key=lambda t: t.turn)
        return [self._record(turn) for turn in turns if turn.user or turn.assistant]

    def _append(self, records: list[dict[str, Any]]) -> None:
        if self.content:
            with self.transcript_path.open("a", encoding="utf-8") as file:
                for record in records:
                    file.write(json.dumps(record, ensure_ascii=False) + "\n")

    def _finish(self, turn: Turn) -> None:
        record = turn.record()
        self._append([record])
        if self.content:
            log.info("turn %d: %s | %r -> %r", turn.turn, format_figures(record["timings"]), turn.user,
                     record["assistant"])
        else:
            log.info("turn %d: %s", turn.turn, format_figures(record["timings"]))
        self.write()
        if not turn.speculative:
            for listener in self._listeners:
                listener.turn_finished(turn, record)

    def _kept(self) -> list[Turn]:
        """Turns in order, without a speculative attempt that was never confirmed (it may not leave a trace)."""
        return [turn for turn in sorted(self.turns.values(), key=lambda t: t.turn) if not turn.speculative]

    def summary(self) -> dict[str, Any]:
        records = [self._record(turn) for turn in self._kept() if turn.user or turn.assistant]
        medians = {}
        for name in FIGURES:
            values = [r["timings"][name] for r in records if r["timings"][name] is not None]
            medians[name] = round(statistics.median(values), 4) if values else None
        for name in sorted({key for r in records for key in r["reported"]} - set(FIGURES)):
            values = [r["reported"][name] for r in records if name in r["reported"]]  # e.g. a benchmark's wer
            medians[name] = round(statistics.median(values), 4)
        return {"turns": len(records), "completed_turns": sum(r["complete"] for r in records), "median": medians}

    def write(self, status: str | None = None, error: str | None = None) -> None:
        if status:
            self.status, self.error = status, error
        with self._lock:
            turns = [self._record(turn) for turn in self._kept()]
        document = {"status": self.status, "error": self.error, "summary": self.summary(), "turns": turns,
                    "setup_s": {k: round(v, 3) for k, v in self.setup_s.items()},
                    "peak_memory_mb": peak_memory_mb(), "machine": machine_info(), **self.run_info}
        temporary = self.metrics_path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(document, indent=2, ensure_ascii=False))
        os.replace(temporary, self.metrics_path)

    def finish(self, status: str, error: str | None = None) -> None:
        """Write turns that never completed (stopped mid-way) to the transcript, then the final metrics."""
        with self._lock:
            unfinished = [turn for turn in self._kept() if not turn.complete and (turn.user or turn.assistant)]
        records = [(turn, turn.record()) for turn in unfinished]
        self._append([record for _, record in records])
        self.write(status, error)
        for listener in self._listeners:
            for turn, record in records:
                listener.turn_finished(turn, record)
            listener.recording_finished(status, error)


def format_figures(figures: dict[str, float | None]) -> str:
    def show(name: str, label: str, unit: str = " s") -> str:
        value = figures.get(name)
        return f"{label} {'-' if value is None else f'{value:.2f}{unit}'}"

    return ", ".join([show("voice_to_voice_s", "voice-to-voice"), show("endpoint_s", "endpoint"), show("stt_s", "stt"),
                      show("llm_first_token_s", "llm first token"), show("llm_first_sentence_s", "first sentence"),
                      show("tts_first_audio_s", "tts first audio"), show("tts_rtf", "rtf", "")])

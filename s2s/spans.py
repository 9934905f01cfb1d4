"""Span trees from the metrics Recorder's turn records: run or session -> turn -> vad, stt, llm, tts.

A :class:`TurnSpans` listens to one Recorder (``Recorder.listen``, wired by :func:`s2s.tracing.follow`). The
root span opens when it is made and closes when the Recorder finishes. When a turn's record is final, the
turn's spans are made at once, each with the start and end the Recorder measured (``perf_counter`` mapped onto
wall-clock time; input-clock points through the Recorder's anchors), so a trace says what metrics.json says.
The attributes are the record's figures under their metrics.json names (``s2s.voice_to_voice_s``, ...), each
stage's backend and model, and OpenTelemetry's GenAI attributes on the LLM's span, the one GenAI inference
(its token counts as ``gen_ai.usage.*``).
Making them takes microseconds in the thread that ends the turn; exporting them is the batch processor's job.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from s2s.config import StageSpec
from s2s.metrics import Recorder, Turn
from s2s.usage import METRICS

log = logging.getLogger("s2s.tracing")

# The figures each stage's span repeats from its turn's (the turn span has them all).
STAGE_FIGURES: dict[str, tuple[str, ...]] = {
    "vad": ("endpoint_s", "confirm_s", "speech_end_at_s"),
    "stt": ("stt_s",),
    "llm": ("llm_first_token_s", "llm_first_sentence_s", "llm_total_s"),
    "tts": ("tts_first_audio_s", "held_s", "tts_rtf"),
}
# the GenAI attributes of the turn's token counts (every round of the turn's reply, added up by the Recorder)
USAGE = {"gen_ai.usage.input_tokens": METRICS["input_tokens"], "gen_ai.usage.output_tokens": METRICS["output_tokens"],
         "gen_ai.usage.cache_read.input_tokens": METRICS["cached_tokens"]}
FAILED = ("failed",)  # run statuses that mark the root span as an error


def _identity(spec: StageSpec) -> dict[str, Any]:
    """The backend and model of a stage, as its dry-run line shows them (constructors load nothing)."""
    try:
        described = spec.build().describe()
    except Exception:  # a stage that cannot describe itself still gets its backend named
        described = {}
    model = described.get("model")
    return {"s2s.backend": spec.target, **({"s2s.model": str(model)} if model is not None else {})}


def _provider(target: str) -> str:
    """``gen_ai.provider.name`` for an LLM backend: s2s.llm.openai_lm.OpenAILM -> openai, ctranslate2_lm -> ctranslate2."""
    module = target.rsplit(".", 2)[-2] if target.count(".") >= 2 else target
    return module.removesuffix("_lm")


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attributes OpenTelemetry takes: None left out, anything that is not str/bool/int/float as text."""
    return {key: value if isinstance(value, (str, bool, int, float)) else str(value)
            for key, value in attributes.items() if value is not None}


def _wall_of(turn: Turn, at_s: float | None) -> float | None:
    """The perf_counter time of an input-clock point the Recorder anchored (the segment's release, the
    confirmation), or None."""
    if at_s is None:
        return None
    return next((wall for anchored, wall in turn.anchors if anchored == at_s), None)


class TurnSpans:
    """A Recorder listener that turns each finished turn into a span tree under one root.

    Args:
        tracer: an OpenTelemetry tracer (the process's, from :mod:`s2s.tracing`).
        kind: the root span's name: ``run`` or ``session``.
        specs: the validated stages; the spans of vad, stt, llm and tts name their backend and model.
        recorder: the Recorder it listens to (its summary and setup times go on the root at the end).
        attributes: the root's own attributes (a session's ``session.id``).
        text: the user's and the assistant's words go on the turn span too.
    """

    def __init__(self, tracer: Any, kind: str, specs: list[StageSpec], recorder: Recorder,
                 attributes: dict[str, Any], text: bool = False) -> None:
        from opentelemetry import trace

        self._trace, self.tracer, self.recorder, self.text = trace, tracer, recorder, text
        self._wall_ns, self._perf = time.time_ns(), time.perf_counter()
        self.stages = {spec.group: _identity(spec) for spec in specs if spec.group in STAGE_FIGURES}
        self.conversation = attributes.get("session.id")
        root = {**{f"s2s.stage.{spec.group}": spec.target for spec in specs}, **attributes}
        self.root = tracer.start_span(kind, attributes=_clean(root), start_time=self._wall_ns)
        self._context = trace.set_span_in_context(self.root)
        self._lock = threading.Lock()
        self._ended = False

    def _ns(self, perf: float) -> int:
        return self._wall_ns + int((perf - self._perf) * 1e9)

    # --- TurnListener -----------------------------------------------------------------------------
    def turn_finished(self, turn: Turn, record: dict[str, Any]) -> None:
        """Make the turn's spans; a bug here is logged, and the conversation goes on."""
        try:
            with self._lock:
                if not self._ended:
                    self._turn(turn, record)
        except Exception:
            log.exception("tracing: the spans of turn %d could not be made", turn.turn)

    def recording_finished(self, status: str, error: str | None) -> None:
        """Close the root span with the run's or session's status, summary and setup times."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        try:
            summary = self.recorder.summary()
            self.root.set_attributes(_clean({
                "s2s.status": status, "s2s.turns": summary["turns"], "s2s.completed_turns": summary["completed_turns"],
                **{f"s2s.median.{name}": value for name, value in summary["median"].items()},
                **{f"s2s.setup_s.{group}": round(seconds, 3) for group, seconds in self.recorder.setup_s.items()}}))
            if status in FAILED:
                self.root.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error or status))
        finally:
            self.root.end()

    # --- the tree ---------------------------------------------------------------------------------
    def _stage_times(self, turn: Turn) -> dict[str, tuple[float, float]]:
        """(start, end) in perf_counter seconds of each stage that worked on the turn."""
        times: dict[str, tuple[float, float]] = {}
        closed, confirmed = _wall_of(turn, turn.closed_at_s), _wall_of(turn, turn.confirmed_at_s)
        if closed is not None and turn.speech_end_at_s is not None and turn.closed_at_s is not None:
            # from the last voiced frame until the VAD let the segment go, or confirmed a speculative one; input
            # that came faster than real time would put the frame before the root began: it starts with the root
            speech_end = max(closed - (turn.closed_at_s - turn.speech_end_at_s), self._perf)
            times["vad"] = (speech_end, max(closed, confirmed or closed))
        if turn.stt_start is not None and turn.stt_end is not None:
            times["stt"] = (turn.stt_start, turn.stt_end)
        if turn.llm_start is not None and turn.llm_end is not None:
            times["llm"] = (turn.llm_start, turn.llm_end)
        if turn.tts_start is not None:
            times["tts"] = (turn.tts_start, turn.tts_end or turn.tts_first_audio or turn.tts_start)
        return times

    def _turn(self, turn: Turn, record: dict[str, Any]) -> None:
        timings = record["timings"]
        times = self._stage_times(turn)
        ends = [end for _, end in times.values()] + [p for p in (turn.finished_at,) if p is not None]
        start = min((s for s, _ in times.values()), default=turn.finished_at or time.perf_counter())
        end = max(ends, default=start)
        figures = {f"s2s.{name}": value for name, value in timings.items()}
        figures.update({f"s2s.{name}": value for name, value in record["reported"].items() if name not in timings})
        attributes = {"s2s.turn": turn.turn, "s2s.complete": turn.complete, "s2s.language": turn.language,
                      "s2s.user_audio_s": record["user_audio_s"], "s2s.reply_audio_s": record["reply_audio_s"],
                      **figures, **({"s2s.user": record["user"], "s2s.assistant": record["assistant"]}
                                    if self.text else {})}
        span = self.tracer.start_span("turn", context=self._context, start_time=self._ns(start),
                                      attributes=_clean(attributes))
        if turn.first_reply_at_sink is not None:  # when the first reply sound played (its leading silence skipped)
            span.add_event("first_audio_heard", timestamp=self._ns(turn.first_reply_at_sink + turn.lead_silence_s))
        inside = self._trace.set_span_in_context(span)
        for stage, (stage_start, stage_end) in times.items():
            self._stage(stage, turn, record, inside, stage_start, stage_end)
        span.end(end_time=self._ns(max(end, start)))

    def _stage(self, stage: str, turn: Turn, record: dict[str, Any], context: Any, start: float, end: float) -> None:
        timings = record["timings"]
        attributes: dict[str, Any] = {"s2s.turn": turn.turn, **self.stages.get(stage, {}),
                                      **{f"s2s.{name}": timings.get(name) for name in STAGE_FIGURES[stage]}}
        if stage == "vad":
            attributes["s2s.user_audio_s"] = record["user_audio_s"]
        elif stage == "stt":
            attributes["s2s.language"] = turn.language
        elif stage == "llm":
            backend = self.stages.get("llm", {})
            attributes.update({"gen_ai.operation.name": "chat", "gen_ai.output.type": "text",
                               "gen_ai.provider.name": _provider(str(backend.get("s2s.backend", "s2s"))),
                               "gen_ai.request.model": backend.get("s2s.model"),
                               "gen_ai.response.time_to_first_chunk": timings.get("llm_first_token_s"),
                               "gen_ai.conversation.id": self.conversation,
                               **{name: int(record["reported"][figure]) for name, figure in USAGE.items()
                                  if figure in record["reported"]}})
        elif stage == "tts":
            attributes["s2s.reply_audio_s"] = record["reply_audio_s"]
        span = self.tracer.start_span(stage, context=context, start_time=self._ns(start), attributes=_clean(attributes))
        if stage == "llm":
            if timings.get("llm_first_token_s") is not None:
                span.add_event("first_token", timestamp=self._ns(start + timings["llm_first_token_s"]))
            if turn.llm_first_sentence is not None:
                span.add_event("first_sentence", timestamp=self._ns(turn.llm_first_sentence))
            for event in record.get("events", []):  # tool calls and errors, in order; their time is not kept
                details = {key: value for key, value in event.items() if key != "event"}
                span.add_event(str(event.get("event")), attributes=_clean(details), timestamp=self._ns(end))
                if event.get("event") == "llm_error":
                    span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(event.get("error"))))
        elif stage == "tts" and turn.tts_first_audio is not None:
            span.add_event("first_audio", timestamp=self._ns(turn.tts_first_audio))
        span.end(end_time=self._ns(max(end, start)))

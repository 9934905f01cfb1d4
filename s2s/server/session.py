"""One realtime session: protocol events in, a stage graph in the middle, protocol events out.

The client's events are checked (``protocol``) and applied here, in the server's event loop. The graph runs in
its own threads; whatever it produces that the client must hear about (speech started or stopped, a
transcript, reply text and audio, the end of a reply) is posted back to the event loop, which turns it into
server events. One writer task sends everything, so events keep their order.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from s2s import audio
from s2s.config import StageSpec
from s2s.graph import Graph, RunResult
from s2s.llm.base import LLMStage
from s2s.messages import (Data, Message, Metric, ReplyAudio, ReplyText, SpeechSegment, SpeechStarted,
                          Transcript, TurnConfirmed, TurnDiscarded, TurnEnd)
from s2s.metrics import Recorder
from s2s.server import protocol
from s2s.server.pipelines import Pipeline, override_errors
from s2s.server.protocol import ClientEvent, ProtocolError, event
from s2s.server.settings import ServerSettings
from s2s.server.stages import SessionVAD, SocketSink, SocketSource, TurnCounter
from s2s.server.tools import ClientToolbox, accepts_client_tools

log = logging.getLogger("s2s.server")

PIPELINE_RATE = 16000
DELTA_S = 0.25  # longest audio delta sent; a TTS block of several seconds is split


@dataclass
class Response:
    """One reply: queued behind the one being sent, active, or finished (completed / cancelled / failed)."""

    turn: int
    id: str = field(default_factory=lambda: protocol.new_id("resp"))
    item_id: str = field(default_factory=lambda: protocol.new_id("item"))
    status: str = "queued"
    transcript: list[str] = field(default_factory=list)
    user_text: str | None = None  # what the turn asked (None for a tool continuation)
    audio_s: float = 0.0
    calls: list[dict[str, Any]] = field(default_factory=list)
    held: list[tuple[str, Any]] = field(default_factory=list)  # what came while queued

    @property
    def finished(self) -> bool:
        return self.status not in ("queued", "active")


class _Observer:
    """The session's view of the graph: every figure goes to the Recorder, protocol-worthy messages to ``post``."""

    def __init__(self, recorder: Recorder, post: Callable[[tuple[str, Any]], None], vad_stage: str,
                 last_stage: str) -> None:
        self.recorder, self.post, self.vad_stage, self.last_stage = recorder, post, vad_stage, last_stage
        self._pending: dict[int, list[tuple[str, Any]]] = {}  # speculative turns: events wait for confirmation
        self._lock = threading.Lock()

    def _post(self, turn: int, item: tuple[str, Any]) -> None:
        """Send now, or once ``turn`` is confirmed: the client never hears of a speculative attempt."""
        with self._lock:
            if turn in self._pending:
                self._pending[turn].append(item)
                return
        self.post(item)

    def on_input(self, stage: str, message: Data, now: float) -> None:
        self.recorder.on_input(stage, message, now)

    def on_done(self, stage: str, message: Data, now: float) -> None:
        self.recorder.on_done(stage, message, now)

    def on_output(self, stage: str, message: Message, now: float) -> None:
        self.recorder.on_output(stage, message, now)
        if isinstance(message, SpeechStarted) and stage == self.vad_stage:  # control passes every stage: once
            self.post(("speech_started", message.turn))
        elif isinstance(message, SpeechSegment):
            if message.speculative:
                with self._lock:
                    self._pending.setdefault(message.turn, [])
            self._post(message.turn, ("speech_stopped", message))
        elif isinstance(message, (TurnConfirmed, TurnDiscarded)) and stage == self.vad_stage:
            with self._lock:
                held = self._pending.pop(message.turn, [])
            if isinstance(message, TurnConfirmed):
                for item in held:
                    self.post(item)
        elif isinstance(message, Transcript):
            self._post(message.turn, ("transcript", message))
        elif isinstance(message, ReplyText):
            self._post(message.turn, ("reply_text", message))
        elif isinstance(message, TurnEnd) and stage == self.last_stage:
            self.post(("turn_end", message.turn))

    def on_metric(self, stage: str, metric: Metric) -> None:
        self.recorder.on_metric(stage, metric)


class Session:
    """A client's conversation: its settings, its own VAD and graph, a pooled pipeline and its responses.

    Args:
        session_id: shown to the client and in ``GET /v1/sessions``.
        cfg: the composed config (stages are validated against it when the client changes a setting).
        specs: the validated stage specs of the config.
        pipeline: the pooled stages this session holds until it ends.
        limits: what a client may send.
        send: coroutine sending one server event (JSON-ready dict) to the client.
        output_dir: where the session's transcript.jsonl and metrics.json go.
        model: what the client asked for in ``?model=`` (echoed back; the config decides what runs).
    """

    def __init__(self, session_id: str, cfg: Any, specs: list[StageSpec], pipeline: Pipeline,
                 limits: ServerSettings, send: Callable[[dict[str, Any]], Awaitable[None]], output_dir: Path,
                 model: str = "s2s") -> None:
        self.id, self.cfg, self.specs, self.pipeline, self.limits = session_id, cfg, specs, pipeline, limits
        self._send, self.model = send, model
        self.loop = asyncio.get_running_loop()
        self.started_at = time.time()
        self.status = "active"
        groups = {spec.group: spec for spec in specs}
        self.vad_spec, self.tts_spec = specs[1], groups.get("tts", specs[-2])
        self.recorder = Recorder(output_dir, last_stage=specs[-1].group,
                                 run_info={"session": session_id, "stages": {s.group: s.target for s in specs}})
        # settings the client can change (session.update), starting from the composed config
        self.instructions: str | None = pipeline.defaults.get("system_prompt")
        self.voice: str | None = self.tts_spec.kwargs.get("voice")
        self.input_rate = self.output_rate = protocol.DEFAULT_RATE
        self.turn_detection = protocol.TurnDetection()
        self.tools: list[dict[str, Any]] = []
        self.tool_choice = "auto"
        # runtime
        self.turns = TurnCounter()
        self.graph: Graph | None = None
        self._graph_thread: threading.Thread | None = None
        self._source: SocketSource | None = None
        self._vad: SessionVAD | None = None
        self._own_tts: Any = None  # a TTS built for this session's voice, closed with it
        self._resampler: Any = None
        self._outbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._responses: deque[Response] = deque()
        self._by_turn: dict[int, Response] = {}
        self._typed_turns: set[int] = set()
        self._pending: list[protocol.Item] = []
        self._calls: dict[str, dict[str, Any]] = {}  # call_id -> the function call the LLM made
        self._toolbox: ClientToolbox | None = None  # installed in the LLM while the session has tools
        self._input_samples = 0  # at the pipeline rate: the input stream's clock
        self._audio_sent = False
        self.responses_completed = self.responses_cancelled = 0

    # ------------------------------------------------------------------ outbound
    def post(self, item: tuple[str, Any]) -> None:
        """Queue an item for the writer; callable from any thread."""
        try:
            self.loop.call_soon_threadsafe(self._outbox.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server stopping): nothing left to tell
            pass

    def say(self, server_event: dict[str, Any]) -> None:
        self._outbox.put_nowait(("send", server_event))

    def fail(self, error: ProtocolError) -> None:
        log.info("session %s: %s: %s", self.id, error.code, error.message)
        self.say(protocol.error_event(error))

    async def writer(self) -> None:
        """Send everything queued, in order, until ``("close", None)``."""
        while True:
            kind, payload = await self._outbox.get()
            if kind == "close":
                return
            try:
                events = self._translate(kind, payload)
            except Exception as error:  # a bug here must not silence the session
                log.exception("session %s: could not translate %s", self.id, kind)
                events = [protocol.error_event(ProtocolError("server_error", f"internal error: {error}"))]
            for server_event in events:
                await self._send(server_event)

    def session_object(self) -> dict[str, Any]:
        td = self.turn_detection
        vad = {**self.vad_spec.kwargs, **td.vad_overrides()}
        return {
            "type": "realtime", "object": "realtime.session", "id": self.id, "model": self.model,
            "output_modalities": ["audio"], "instructions": self.instructions or "",
            "tools": self.tools, "tool_choice": self.tool_choice,
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": self.input_rate},
                          "transcription": {"model": str(self.stt_model)},
                          "turn_detection": {"type": "server_vad", "threshold": vad.get("threshold"),
                                             "silence_duration_ms": vad.get("min_silence_ms"),
                                             "prefix_padding_ms": vad.get("speech_pad_ms"),
                                             "interrupt_response": td.interrupt_response,
                                             "create_response": True}},
                "output": {"format": {"type": "audio/pcm", "rate": self.output_rate}, "voice": self.voice}},
        }

    @property
    def stt_model(self) -> str:
        spec = next((spec for spec in self.specs if spec.group == "stt"), self.specs[2])
        return str(spec.kwargs.get("model", spec.target))

    # ------------------------------------------------------------------ inbound
    async def handle(self, frame: str | bytes) -> None:
        """One client frame; a bad one becomes an ``error`` event and the session goes on."""
        try:
            client_event = protocol.parse_frame(frame, self.limits)
            handler = {"session.update": self._session_update, "input_audio_buffer.append": self._append,
                       "response.create": self._response_create, "response.cancel": self._response_cancel,
                       "conversation.item.create": self._item_create}[client_event.type]
            await handler(client_event)
        except ProtocolError as error:
            self.fail(error)
        except Exception as error:  # a bug or a stage failing to build: this event fails, the session goes on
            log.exception("session %s: handling a client event failed", self.id)
            self.fail(ProtocolError("server_error", f"internal error: {type(error).__name__}: {error}"))

    async def _session_update(self, client_event: ClientEvent) -> None:
        update = protocol.parse_session_update(client_event, self.limits)
        eid = client_event.event_id
        # check everything first: an update applies whole or not at all
        if update.voice is not None and update.voice != self.voice:
            if self.graph is not None:
                raise ProtocolError("cannot_update_voice", "the voice can only change before the first audio "
                                                           "or response", "session.audio.output.voice", eid)
            self._check(self.tts_spec, {"voice": update.voice}, "session.audio.output.voice", eid)
        if update.instructions is not None and not isinstance(self.pipeline.llm, LLMStage):
            raise ProtocolError("invalid_value", f"llm {type(self.pipeline.llm).__name__} takes no instructions",
                                "session.instructions", eid)
        new_vad = None
        if update.turn_detection is not None:
            overrides = update.turn_detection.vad_overrides()
            self._check(self.vad_spec, overrides, "session.audio.input.turn_detection", eid)
            if self.graph is not None and overrides != self.turn_detection.vad_overrides():
                new_vad = await self.loop.run_in_executor(None, self._build_vad, overrides)
        if update.tools is not None:
            self._check_tools(update.tools, eid)
        # apply
        if update.voice is not None:
            self.voice = update.voice
        if update.instructions is not None:
            self.instructions = update.instructions
            self.pipeline.llm.system_prompt = update.instructions  # read by the LLM at its next turn
        if update.input_rate is not None and update.input_rate != self.input_rate:
            self.input_rate, self._resampler = update.input_rate, None
        if update.output_rate is not None:
            self.output_rate = update.output_rate
        if update.turn_detection is not None:
            self.turn_detection = update.turn_detection
            if self.graph is not None:
                self.graph.barge_in = update.turn_detection.interrupt_response
            if new_vad is not None and self._vad is not None:
                self._vad.replace(new_vad)
        if update.tools is not None:
            self.tools = update.tools
        if update.tool_choice is not None:
            self.tool_choice = update.tool_choice
        if update.tools is not None or update.tool_choice is not None:
            self._install_tools()
        self.say(event("session.updated", session=self.session_object()))

    def _check(self, spec: StageSpec, overrides: dict[str, Any], param: str, eid: str | None) -> None:
        errors = override_errors(self.cfg, spec, overrides)
        if errors:
            first = errors[0]
            raise ProtocolError("invalid_value", f"{first.key.split('.')[-1]}={first.value!s} is not accepted by "
                                                 f"{spec.group}={spec.target.rsplit('.', 1)[-1]}; expected "
                                                 f"{first.expected}", param, eid)

    def _check_tools(self, tools: list[dict[str, Any]], eid: str | None) -> None:
        problem = accepts_client_tools(self.pipeline.llm) if tools else None
        if problem:
            raise ProtocolError("tools_not_supported", problem, "session.tools", eid)

    def _install_tools(self) -> None:
        """Hand the session's tools to its LLM (or take them away), from its next turn on."""
        wanted = bool(self.tools) and self.tool_choice != "none"
        if wanted:
            if self._toolbox is not None:
                self._toolbox.release()
            self._toolbox = ClientToolbox(self.tools, self._announce_call)
            self.pipeline.llm.use_tools(self._toolbox)  # type: ignore[union-attr]
        elif self._toolbox is not None:
            self._toolbox.release()
            self._toolbox = None
            self.pipeline.llm.use_tools(None)  # type: ignore[union-attr]

    def _announce_call(self, call_id: str, call: Any) -> None:
        self.post(("tool_call", {"call_id": call_id, "name": call.name,
                                 "arguments": json.dumps(call.arguments, ensure_ascii=False)}))

    async def _append(self, client_event: ClientEvent) -> None:
        samples = protocol.decode_audio(client_event)
        await self.ensure_graph()
        floats = audio.int16_to_float(samples)
        if self.input_rate != PIPELINE_RATE:
            if self._resampler is None:
                import soxr  # a streaming resampler: appends are short, and edges would click per block

                self._resampler = soxr.ResampleStream(self.input_rate, PIPELINE_RATE, 1, dtype="float32")
            floats = self._resampler.resample_chunk(floats)
        self._input_samples += len(floats)
        assert self._source is not None
        self._source.feed(np.ascontiguousarray(floats, dtype=np.float32))

    async def _item_create(self, client_event: ClientEvent) -> None:
        item = protocol.parse_item(client_event)
        if item.kind == "function_call_output" and item.call_id not in self._calls:
            raise ProtocolError("invalid_value", f"no function call with call_id '{item.call_id}' in this "
                                                 f"session", "item.call_id", client_event.event_id)
        self._pending.append(item)
        if item.kind == "input_text":
            shown = {"id": protocol.new_id("item"), "object": "realtime.item", "type": "message",
                     "role": "user", "status": "completed", "content": [{"type": "input_text", "text": item.text}]}
        else:
            shown = {"id": protocol.new_id("item"), "object": "realtime.item", "type": "function_call_output",
                     "call_id": item.call_id, "output": item.text}
        self.say(event("conversation.item.created", previous_item_id=None, item=shown))

    async def _response_create(self, client_event: ClientEvent) -> None:
        protocol.check_response_create(client_event)
        eid = client_event.event_id
        if any(not r.finished for r in self._responses):
            raise ProtocolError("conversation_already_has_active_response", "a response is in progress; wait "
                                "for its response.done or send response.cancel", None, eid)
        if not self._pending:
            raise ProtocolError("invalid_request", "nothing to respond to: add a conversation item "
                                "(input_text or function_call_output) first, or speak", None, eid)
        await self.ensure_graph()
        outputs = [item for item in self._pending if item.kind == "function_call_output" and self._toolbox
                   and self._toolbox.waiting(item.call_id or "")]
        if outputs:  # the LLM waits for these: its turn goes on, as a new response
            self._pending = [item for item in self._pending if item not in outputs]
            self._outbox.put_nowait(("continue", [(item.call_id, item.text) for item in outputs]))
            return
        text = typed_turn_text(self._pending, self._calls)
        self._pending = []
        turn = self.turns.next()
        self._typed_turns.add(turn)
        assert self.graph is not None
        self.graph.inject("llm", Transcript(text, turn))

    async def _response_cancel(self, client_event: ClientEvent) -> None:
        protocol.check_bare(client_event)
        current = next((r for r in self._responses if r.status == "active"), None)
        if current is None:
            raise ProtocolError("response_cancel_not_active", "there is no response in progress to cancel", None,
                                client_event.event_id)
        assert self.graph is not None
        self.graph.cancel_turns_below(current.turn + 1)
        if self._toolbox is not None:
            self._toolbox.release()
        self._outbox.put_nowait(("cancel", (current.turn, "client_cancelled")))

    # ------------------------------------------------------------------ the graph
    def _build_vad(self, overrides: dict[str, Any]) -> Any:
        vad = self.vad_spec.cls(**{**self.vad_spec.kwargs, **overrides})
        vad.setup()
        return vad

    async def ensure_graph(self) -> None:
        """Build and start the session's graph on first use (after the client had its chance to configure it)."""
        if self.graph is None:
            await self.loop.run_in_executor(None, self._start_graph)

    def _start_graph(self) -> None:
        stages = list(self.pipeline.stages)
        if self.voice != self.tts_spec.kwargs.get("voice"):
            self._own_tts = self.tts_spec.cls(**{**self.tts_spec.kwargs, "voice": self.voice})
            self._own_tts.setup()
            stages = [(name, self._own_tts if name == self.tts_spec.group else stage) for name, stage in stages]
        self._source = SocketSource(PIPELINE_RATE)
        self._vad = SessionVAD(self._build_vad(self.turn_detection.vad_overrides()), self.turns)
        sink = SocketSink(lambda message: self.post(("audio", message)))
        chain = [(self.specs[0].group, self._source), (self.vad_spec.group, self._vad), *stages,
                 (self.specs[-1].group, sink)]
        runner = self.cfg.runner
        self.graph = Graph(chain, _Observer(self.recorder, self.post, self.vad_spec.group, self.specs[-1].group),
                           barge_in=self.turn_detection.interrupt_response, half_duplex=False,
                           stop_timeout_s=float(runner.stop_timeout_s),
                           first_audio_wait_s=float(runner.first_audio_wait_s))
        self._graph_thread = threading.Thread(target=self._run_graph, name=f"s2s-session-{self.id[-6:]}",
                                              daemon=True)
        self._graph_thread.start()

    def _run_graph(self) -> None:
        assert self.graph is not None
        result = self.graph.run()
        self.post(("graph_ended", result))

    def close(self, status: str) -> None:
        """Stop the graph, free what is the session's own, record the end (blocking: run it in an executor)."""
        self.status = status
        if self._toolbox is not None:
            self._toolbox.release()
            self.pipeline.llm.use_tools(None)  # type: ignore[union-attr]
        if self.graph is not None:
            self.graph.stop()
            assert self._source is not None
            self._source.end()
            assert self._graph_thread is not None
            self._graph_thread.join(float(self.cfg.runner.stop_timeout_s) + 1.0)
        for stage in (self._vad, self._own_tts):
            if stage is not None:
                try:
                    stage.close()
                except Exception as error:
                    log.warning("session %s: closing %s failed: %s", self.id, type(stage).__name__, error)
        self.recorder.finish(status)

    def describe(self) -> dict[str, Any]:
        """What ``GET /v1/sessions`` shows: state and the same per-turn figures as a local run's metrics.json."""
        turns = [turn.record() for turn in sorted(self.recorder.turns.values(), key=lambda t: t.turn)
                 if turn.user or turn.assistant]
        return {"id": self.id, "status": self.status, "started_at": round(self.started_at, 3),
                "pipeline": self.pipeline.index, "responses_completed": self.responses_completed,
                "responses_cancelled": self.responses_cancelled, "summary": self.recorder.summary(),
                "turns": turns, "metrics_path": str(self.recorder.metrics_path)}

    # ------------------------------------------------------------------ graph -> protocol
    def _translate(self, kind: str, payload: Any) -> list[dict[str, Any]]:
        if kind == "send":
            return [payload]
        if kind == "cancel":
            turn, reason = payload
            return self._finish_turn(turn, "cancelled", reason)
        if kind == "speech_started":
            out = [event("input_audio_buffer.speech_started", item_id=self._user_item(payload),
                         audio_start_ms=self._input_samples * 1000 // PIPELINE_RATE)]
            if self.graph is not None and self.graph.barge_in:
                if self._toolbox is not None and any(r.turn < payload and not r.finished for r in self._responses):
                    self._toolbox.release()
                for response in list(self._responses):
                    if response.turn < payload and not response.finished:
                        out += self._finish(response, "cancelled", "turn_detected")
            return out
        if kind == "speech_stopped":
            return [event("input_audio_buffer.speech_stopped", item_id=self._user_item(payload.turn),
                          audio_end_ms=int(payload.end_s * 1000))]
        if kind == "transcript":
            out = []
            if payload.turn not in self._typed_turns:
                out.append(event("conversation.item.input_audio_transcription.completed",
                                 item_id=self._user_item(payload.turn), content_index=0, transcript=payload.text,
                                 usage={"type": "duration", "seconds": self._user_seconds(payload.turn)}))
            response = Response(payload.turn, user_text=payload.text)
            self._by_turn[payload.turn] = response
            self._responses.append(response)
            return out + self._open_next()
        if kind == "reply_text":
            return self._to_response(payload.turn, "text", payload.text)
        if kind == "audio":
            return self._to_response(payload.turn, "audio", payload)
        if kind == "turn_end":
            return self._to_response(payload, "end", None)
        if kind == "tool_call":  # the LLM works on the newest turn
            open_ones = [r for r in self._responses if not r.finished]
            return self._to_response(open_ones[-1].turn, "tool", payload) if open_ones else []
        if kind == "continue":
            return self._continue(payload)
        if kind == "graph_ended":
            return self._graph_ended(payload)
        raise AssertionError(f"unknown outbox item {kind}")

    def _user_item(self, turn: int) -> str:
        return f"item_{self.id[-8:]}_{turn}"

    def _user_seconds(self, turn: int) -> float:
        record = self.recorder.turns.get(turn)
        return round(record.user_audio_s or 0.0, 3) if record else 0.0

    def _open_next(self) -> list[dict[str, Any]]:
        """Start the first queued response if none is being sent."""
        while self._responses and self._responses[0].finished:
            self._responses.popleft()
        if not self._responses or self._responses[0].status != "queued":
            return []
        response = self._responses[0]
        response.status = "active"
        out = [event("response.created", response=protocol.response_object(response.id, "in_progress"))]
        held, response.held = response.held, []
        for kind, payload in held:
            out += self._to_response(response.turn, kind, payload)
        return out

    def _to_response(self, turn: int, kind: str, payload: Any) -> list[dict[str, Any]]:
        response = self._by_turn.get(turn)
        if response is None or response.finished:
            return []  # a turn without a reply (no words), or one already cancelled: nothing more for it
        if response.status == "queued":
            response.held.append((kind, payload))
            return []
        ids = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        if kind == "text":
            delta = (" " if response.transcript else "") + payload
            response.transcript.append(payload)
            return [event("response.output_audio_transcript.delta", delta=delta, **ids)]
        if kind == "audio":
            return self._audio_deltas(response, payload, ids)
        if kind == "tool":  # a call ends the response; its output and response.create continue the turn
            return self._tool_call(response, payload) + self._finish(response, "completed", None)
        return self._finish(response, "completed", None)

    def _audio_deltas(self, response: Response, message: ReplyAudio, ids: dict[str, Any]) -> list[dict[str, Any]]:
        samples = audio.float_to_int16(audio.resample(message.samples, message.sample_rate, self.output_rate))
        response.audio_s += len(samples) / self.output_rate
        self._audio_sent = True
        step = max(1, int(DELTA_S * self.output_rate))
        return [event("response.output_audio.delta", delta=protocol.encode_audio(samples[i:i + step]), **ids)
                for i in range(0, len(samples), step)]

    def _tool_call(self, response: Response, call: dict[str, Any]) -> list[dict[str, Any]]:
        call_id = call["call_id"]
        item_id = protocol.new_id("item")
        record = {"type": "function_call", "id": item_id, "call_id": call_id, "name": call["name"],
                  "arguments": call["arguments"], "status": "completed", "object": "realtime.item"}
        self._calls[call_id] = {**record, "turn": response.turn}
        response.calls.append(record)
        return [event("response.function_call_arguments.done", response_id=response.id, item_id=item_id,
                      output_index=len(response.calls), call_id=call_id, name=call["name"],
                      arguments=call["arguments"])]

    def _continue(self, outputs: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """Tool outputs for a waiting LLM: a new response for the same turn, then the LLM goes on."""
        turn = self._calls[outputs[0][0]]["turn"]
        response = Response(turn)
        self._by_turn[turn] = response
        self._responses.append(response)
        out = self._open_next()
        for call_id, output in outputs:
            if self._toolbox is None or not self._toolbox.deliver(call_id, output):
                log.info("session %s: output for %s came too late", self.id, call_id)
        return out

    def _finish_turn(self, turn: int, status: str, reason: str | None) -> list[dict[str, Any]]:
        response = self._by_turn.get(turn)
        return [] if response is None else self._finish(response, status, reason)

    def _finish(self, response: Response, status: str, reason: str | None) -> list[dict[str, Any]]:
        if response.finished:
            return []
        was_active, response.status = response.status == "active", status
        if not was_active:  # never announced: it simply never happens for the client
            return self._open_next()
        ids = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        transcript = " ".join(response.transcript)
        message = {"id": response.item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                   "status": "completed" if status == "completed" else "incomplete",
                   "content": [{"type": "output_audio", "transcript": transcript}]}
        out = [event("response.output_audio.done", **ids),
               event("response.output_audio_transcript.done", transcript=transcript, **ids),
               event("response.done", response=protocol.response_object(response.id, status,
                                                                        [message, *response.calls], reason))]
        if status == "completed":
            self.responses_completed += 1
        elif status == "cancelled":
            self.responses_cancelled += 1
            if response.user_text is not None and isinstance(self.pipeline.llm, LLMStage):
                # what reached the client stays in the history, the rest of the reply does not
                self.pipeline.llm.remember(response.turn, response.user_text, transcript)
        log.info("session %s: response %s %s (%.2f s of audio)%s", self.id, response.id[-6:], status,
                 response.audio_s, f", {reason}" if reason else "")
        return out + self._open_next()

    def _graph_ended(self, result: RunResult) -> list[dict[str, Any]]:
        if result.failure is None:
            return []
        log.error("session %s: %s", self.id, result.failure)
        out = []
        for response in list(self._responses):
            out += self._finish(response, "failed", None)
        error = ProtocolError("server_error", f"the session's pipeline stopped: {result.failure}")
        return out + [protocol.error_event(error)]


def typed_turn_text(items: list[protocol.Item], calls: dict[str, dict[str, Any]]) -> str:
    """The user text of a typed turn: the input_text items, and each function output named by its call."""
    parts = []
    for item in items:
        if item.kind == "input_text":
            parts.append(item.text)
        else:
            call = calls[item.call_id or ""]
            parts.append(f"The result of {call['name']}({call['arguments']}) is: {item.text}")
    return "\n".join(parts)


def dumps(server_event: dict[str, Any]) -> str:
    return json.dumps(server_event, ensure_ascii=False)

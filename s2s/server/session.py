"""One realtime session: the client's events in, a stage graph in the middle, server events out.

The session keeps the handlers of client events and the lifecycle of its graph. The rest has a room of its
own: the settings a client may change (``session_settings``), the responses' state machine (``responses``),
the outbox and its typed messages (``outbox``), their translation into server events (``translator``) and
client tools (``tools``). The graph runs in its own threads; whatever the client must hear of reaches the
outbox, and one writer sends everything, so events keep their order.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from s2s import audio
from s2s.config import StageSpec, validation_context
from s2s.graph import Graph
from s2s.llm.base import LLMStage
from s2s.messages import SpeechSegment, Transcript, TranscriptSoFar
from s2s.metrics import Recorder
from s2s.server import protocol
from s2s.server.client_log import ClientLog, quote
from s2s.server.idle import IDLE_NOTE, IdleTimer
from s2s.server.outbox import (CancelReply, Close, Committed, GraphEnded, GraphObserver, ItemAdded, ItemAsked,
                               ItemsAnswered, Outbox, ReplySound, Send, ToolOutputs, UserIdle, UserPartial)
from s2s.server.pipelines import Pipeline
from s2s.server.roles import find_roles
from s2s.server.protocol import ClientEvent, ProtocolError, event
from s2s.server.response_plan import plan_response, typed_turn_text
from s2s.server.responses import ResponseQueue, State
from s2s.server.session_settings import SessionSettings, StageRules
from s2s.server.session_update import parse_response_create, parse_session_update
from s2s.server.settings import ServerSettings
from s2s.server.stages import PIPELINE_RATE, SessionVAD, SocketSink, SocketSource, TurnCounter
from s2s.server.tools import ToolBridge
from s2s.stt.base import STTStage
from s2s.server.translator import Translator

log = logging.getLogger("s2s.server")
MIN_COMMIT_S = 0.1  # a manual commit of less input audio than this is refused, as the Realtime API does
MAX_BUFFER_S = 300.0  # manual turns: input audio held until the client commits, at most this much
HISTORY_SHOWN = 10  # GET /v1/sessions shows the LLM's last exchanges (what a client's edits left there)


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
        self.client_log = ClientLog(session_id, log)  # every line its client causes
        self.status = "active"
        self.roles = roles = find_roles(specs)
        self.vad_spec, self.tts_spec = roles.vad, roles.tts
        stt = roles.stt or roles.pooled[0]  # a committed buffer goes to the first stage after the VAD
        self.stt_group = stt.group
        self.transcription = (str(stt.kwargs.get("model", stt.target)), stt.kwargs.get("language"))
        self.recorder = Recorder(output_dir, last_stage=roles.sink.group, content=limits.log_transcripts,
                                 run_info={"session": session_id, "stages": {s.group: s.target for s in specs}})
        self.rules = StageRules(cfg, self.vad_spec, self.tts_spec, pipeline.llm, lambda: self.graph is not None,
                                roles.stt)
        self.settings = SessionSettings(instructions=pipeline.defaults.get("system_prompt"),
                                        voice=self.rules.configured("voice"), vad_defaults=self.vad_spec.kwargs,
                                        speed=self.rules.configured("speed"), visemes=limits.visemes)
        self.overflow = asyncio.Event()  # the client reads too slowly: the server drops the session
        self.outbox = Outbox(self.loop, limits.max_queued_events, self.overflow.set)
        self.chat = pipeline.lend(log_content=limits.log_transcripts)  # this session's conversation
        self.tools = ToolBridge(pipeline.llm, self.chat, self.outbox.put)
        self.responses = ResponseQueue()
        self.idle = IdleTimer(self.loop, lambda: self.settings.turn_detection, self._prompt_idle_user)
        self.turns = TurnCounter()
        self.translator = Translator(session_id, self.responses, self.tools, self.recorder, self.chat,
                                     lambda: self.settings, lambda: self._input_samples, self.idle,
                                     self.turns.utterance)
        self.graph: Graph | None = None
        self._graph_thread: threading.Thread | None = None
        self._source: SocketSource | None = None
        self._vad: SessionVAD | None = None
        self._own_tts: Any = None  # a TTS built for this session's voice, closed with it
        self._resampler: audio.StreamResampler | None = None
        self.last_input = time.monotonic()  # a client event or input audio: the session is not idle
        self._pending: list[protocol.Item] = []  # conversation items waiting for a response.create
        self._input_samples = 0  # at the pipeline rate: the input stream's clock
        self._buffer: list[np.ndarray] = []  # manual turns: the input since the last commit or clear

    @property
    def responses_completed(self) -> int:
        return self.responses.counts[State.COMPLETED]

    @property
    def responses_cancelled(self) -> int:
        return self.responses.counts[State.CANCELLED]

    def session_object(self) -> dict[str, Any]:
        """What ``session.created`` and ``session.updated`` show."""
        return self.settings.view(self.id, self.model, *self.transcription)

    # ------------------------------------------------------------------ outbound
    def fail(self, error: ProtocolError) -> None:
        self.client_log.line(logging.INFO, "%s: %s", error.code, quote(error.message))
        self.outbox.put(Send(protocol.error_event(error)))

    async def writer(self) -> None:
        """Send everything the outbox gets, in order, until :class:`~s2s.server.outbox.Close`."""
        while not isinstance(message := await self.outbox.get(), Close):
            try:
                events = self.translator.translate(message)
            except Exception as error:  # a bug here must not silence the session
                log.exception("session %s: could not translate %s", self.id, type(message).__name__)
                events = [protocol.error_event(ProtocolError("server_error", f"internal error: {error}"))]
            for server_event in events:
                await self._send(server_event)

    # ------------------------------------------------------------------ inbound
    async def handle(self, frame: str | bytes) -> None:
        """One client frame; a bad one becomes an ``error`` event and the session goes on."""
        self.last_input = time.monotonic()
        try:
            client_event = protocol.parse_frame(frame, self.limits)
            handler = {"session.update": self._session_update, "input_audio_buffer.append": self._append,
                       "input_audio_buffer.commit": self._commit, "input_audio_buffer.clear": self._clear,
                       "response.create": self._response_create, "response.cancel": self._response_cancel,
                       "conversation.item.create": self._item_create, "conversation.item.retrieve": self._item_ask,
                       "conversation.item.delete": self._item_ask,
                       "conversation.item.truncate": self._item_ask}[client_event.type]
            await handler(client_event)
        except ProtocolError as error:
            self.fail(error)
        except Exception as error:  # a bug or a stage failing to build: this event fails, the session goes on
            self.client_log.line(logging.ERROR, "handling a client event failed", exc_info=True)
            self.fail(ProtocolError("server_error", f"internal error: {type(error).__name__}: {error}"))

    async def _session_update(self, client_event: ClientEvent) -> None:
        update = parse_session_update(client_event, self.limits)
        if update.voice is not None and self.rules.builtin_voice(update.voice, self.settings.voice):
            update.acknowledged["session.audio.output.voice"] = update.voice  # an SDK's default: ours stays
            update.voice = None
        new = self.settings.apply(update, self.rules, client_event.event_id)  # checked whole: or it raises
        if update.acknowledged:
            self.client_log.line(logging.INFO, "accepted, not applied here: %s",
                                 quote(", ".join(f"{key}={value!r}" for key, value in update.acknowledged.items())))
        vad = None
        if self.graph is not None and update.turn_detection is not None and not new.turn_detection.manual \
                and new.vad_overrides != self.settings.vad_overrides:
            vad = await self.loop.run_in_executor(None, self._build_vad, new.vad_overrides)
        old, self.settings = self.settings, new
        if update.instructions is not None:
            self.chat.system_prompt = new.instructions  # read at the next turn
        self.chat.spoken, self.chat.max_tokens = not new.text_only, new.max_output_tokens
        if old.turn_detection.manual and not new.turn_detection.manual:
            self._buffer = []  # the VAD listens from now on; what was held for a commit is dropped
        if update.turn_detection is not None and self.graph is not None:
            self.graph.barge_in = new.turn_detection.interrupt_response
            if vad is not None and self._vad is not None:
                self._vad.replace(vad)
        if update.tools is not None or update.tool_choice is not None:
            self.tools.install(new.tools, new.tool_choice)
        self.outbox.put(Send(event("session.updated", session=self.session_object())))

    async def _append(self, client_event: ClientEvent) -> None:
        await self.hear(audio.int16_to_float(protocol.decode_audio(client_event)), self.settings.input_rate,
                        client_event.event_id)

    async def hear(self, floats: np.ndarray, rate: int, event_id: str | None = None) -> None:
        """The client's input audio (float32 mono at ``rate``): an append's, or a WebRTC call's microphone."""
        self.last_input = time.monotonic()
        await self.ensure_graph()
        if rate != PIPELINE_RATE:
            if self._resampler is None or self._resampler.rate_in != rate:  # one stream: no click at block edges
                self._resampler = audio.StreamResampler(rate, PIPELINE_RATE)
            floats = self._resampler.feed(floats)
        self._input_samples += len(floats)
        floats = np.ascontiguousarray(floats, dtype=np.float32)
        if self.settings.turn_detection.manual:  # held until the client commits it as a turn
            if sum(map(len, self._buffer)) + len(floats) > MAX_BUFFER_S * PIPELINE_RATE:
                raise ProtocolError("input_audio_buffer_full", f"more than {MAX_BUFFER_S:g} s of input audio "
                                    f"without a commit (turn_detection is null)", None, event_id)
            self._buffer.append(floats)
            return
        assert self._source is not None
        self._source.feed(floats)

    async def _commit(self, client_event: ClientEvent) -> None:
        """Manual turns: the buffer becomes a user turn; with a VAD: the utterance in progress ends now."""
        protocol.check_keys(client_event.body, {"type", "event_id"}, "", client_event.event_id)
        await self.ensure_graph()
        assert self.graph is not None and self._vad is not None and self._source is not None
        if not self.settings.turn_detection.manual:
            if not self._vad.request("commit"):
                raise ProtocolError("input_audio_buffer_commit_empty", "no speech in progress to commit (the "
                                    "server's VAD commits each turn itself)", None, client_event.event_id)
            self._source.poke()
            return
        samples = np.concatenate(self._buffer) if self._buffer else np.zeros(0, dtype=np.float32)
        if len(samples) < MIN_COMMIT_S * PIPELINE_RATE:
            held_ms = len(samples) * 1000 // PIPELINE_RATE
            raise ProtocolError("input_audio_buffer_commit_empty", f"the buffer has {held_ms} ms of audio; a commit "
                                f"needs at least {MIN_COMMIT_S * 1000:.0f} ms", None, client_event.event_id)
        self._buffer = []
        end_s = self._input_samples / PIPELINE_RATE
        turn = self.turns.next()
        self.outbox.put(Committed(turn))
        segment = SpeechSegment(samples, PIPELINE_RATE, turn, end_s - len(samples) / PIPELINE_RATE, end_s,
                                speech_end_s=end_s, closed_s=end_s, language=self.settings.transcription_language)
        self.graph.inject(self.stt_group, segment)  # as if the VAD had ended the turn

    async def _clear(self, client_event: ClientEvent) -> None:
        protocol.check_keys(client_event.body, {"type", "event_id"}, "", client_event.event_id)
        self._buffer = []
        if self._vad is not None and self._source is not None and self._vad.request("clear"):
            self._source.poke()
        self.outbox.put(Send(event("input_audio_buffer.cleared")))

    async def _item_ask(self, client_event: ClientEvent) -> None:
        request = protocol.parse_item_request(client_event)
        if request.kind == "delete":
            self._pending = [item for item in self._pending if item.item_id != request.item_id]
        self.outbox.put(ItemAsked(request))

    async def _item_create(self, client_event: ClientEvent) -> None:
        item = protocol.parse_item(client_event)
        if item.kind == "function_call_output" and self.tools.call(item.call_id or "") is None:
            raise ProtocolError("invalid_value", f"no function call with call_id '{item.call_id}' in this "
                                                 f"session", "item.call_id", client_event.event_id)
        if item.kind == "history":  # history the client brings: the model sees it from the next turn on
            turn = self.turns.next()
            self.chat.add(turn, item.role, item.text)
            self.outbox.put(ItemAdded({**protocol.history_item(item.role, item.text), "id": item.item_id}, turn))
            return
        self._pending.append(item)
        shown = (protocol.user_text_item(item.text) if item.kind == "input_text"
                 else protocol.function_output_item(item.call_id or "", item.text))
        self.outbox.put(ItemAdded({**shown, "id": item.item_id}))

    async def _response_create(self, client_event: ClientEvent) -> None:
        request = parse_response_create(client_event, self.limits)
        eid = client_event.event_id
        if self.responses.busy:
            raise ProtocolError("conversation_already_has_active_response", "a response is in progress; wait "
                                "for its response.done or send response.cancel", None, eid)
        items = self._pending if request.input is None else request.input
        if not items:
            raise ProtocolError("invalid_request", "nothing to respond to: add a conversation item "
                                "(input_text or function_call_output) first, or speak", None, eid)
        plan = plan_response(request, self.settings, self.rules, self.pipeline.llm, self.tools, eid)
        await self.ensure_graph()
        outputs = [item for item in items
                   if item.kind == "function_call_output" and self.tools.waiting(item.call_id or "")]
        if outputs and request.input is None:  # the LLM waits for these: its turn goes on, as a new response
            self._pending = [item for item in self._pending if item not in outputs]
            self.outbox.put(ToolOutputs(tuple((item.call_id or "", item.text) for item in outputs)))
            return
        text = typed_turn_text(items, self.tools)
        turn = self.turns.next()
        if request.input is None:
            self._pending = []
            self.outbox.put(ItemsAnswered(turn, tuple(item.item_id for item in items)))
        self.translator.typed_turns.add(turn)
        self.translator.requests[turn] = request
        if plan is not None:
            self.chat.plan_turn(turn, **plan)
        assert self.graph is not None
        self.graph.inject(self.roles.llm.group, Transcript(text, turn))

    async def _response_cancel(self, client_event: ClientEvent) -> None:
        protocol.check_bare(client_event)
        current = self.responses.active
        if current is None:
            raise ProtocolError("response_cancel_not_active", "there is no response in progress to cancel", None,
                                client_event.event_id)
        assert self.graph is not None
        self.graph.cancel_turns_below(current.turn + 1)
        self.tools.release()
        self.outbox.put(CancelReply(current.turn, "client_cancelled"))

    def _prompt_idle_user(self, timeout_s: float) -> None:
        """``idle_timeout_ms`` ran out after a reply: the silence becomes a user turn, and a response prompts them."""
        if self.status != "active" or self.graph is None or self.responses.busy:
            return
        turn = self.turns.next()
        self.outbox.put(UserIdle(turn, self._input_samples / PIPELINE_RATE, timeout_s))
        self.graph.inject(self.roles.llm.group, Transcript(IDLE_NOTE.format(seconds=timeout_s), turn))

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
        overrides = self.rules.tts_overrides(self.settings.voice, self.settings.speed)
        if overrides and self.pipeline.change_in_place(self.tts_spec.group, overrides,
                                                       validation_context(self.cfg, self.tts_spec.group)):
            log.info("session %s: %s changed in place (%s)", self.id, self.tts_spec.group,
                     ", ".join(f"{key}={value}" for key, value in overrides.items()))
        elif overrides:  # a backend that cannot change them at runtime: a TTS of the session's own
            log.info("session %s: building its own %s for %s", self.id, self.tts_spec.group, overrides)
            self._own_tts = self.tts_spec.cls(**{**self.tts_spec.kwargs, **overrides})
            self._own_tts.setup()
            stages = [(name, self._own_tts if name == self.tts_spec.group else stage) for name, stage in stages]
        self._source = SocketSource(PIPELINE_RATE)
        self._vad = SessionVAD(self._build_vad(self.settings.vad_overrides), self.turns,
                               lambda: self.settings.transcription_language)
        stt = dict(self.pipeline.stages).get(self.stt_group)
        if self.limits.partial_transcripts_s is not None and isinstance(stt, STTStage):
            self._vad.enable_partials(stt, self.limits.partial_transcripts_s,
                                      lambda turn, text: self.outbox.put(UserPartial(turn, text)),
                                      lambda: self.settings.transcription)
        observer = GraphObserver(self.recorder, self.outbox, self.vad_spec.group, self.roles.sink.group,
                                 self.tts_spec.group, heard=self._vad.heard)
        sink = SocketSink(lambda message: self.outbox.put(ReplySound(message, observer.chunk_of(message))))
        chain = [(self.roles.source.group, self._source), (self.vad_spec.group, self._vad), *stages,
                 (self.roles.sink.group, sink)]
        runner = self.cfg.runner
        self.graph = Graph(chain, observer, barge_in=self.settings.turn_detection.interrupt_response,
                           half_duplex=False, stop_timeout_s=float(runner.stop_timeout_s),
                           first_audio_wait_s=float(runner.first_audio_wait_s),
                           wanted=(TranscriptSoFar,) if self.limits.partial_transcripts_s is not None else ())
        self._graph_thread = threading.Thread(target=self._run_graph, name=f"s2s-session-{self.id[-6:]}",
                                              daemon=True)
        self._graph_thread.start()

    def _run_graph(self) -> None:
        assert self.graph is not None
        self.outbox.put(GraphEnded(self.graph.run()))

    def close(self, status: str) -> None:
        """Stop the graph, free what is the session's own, record the end (blocking: run it in an executor)."""
        self.status = status  # an idle prompt still due finds the session over
        self.tools.close()
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
        self.client_log.finish()

    def describe(self) -> dict[str, Any]:
        """What ``GET /v1/sessions`` shows: state and the same per-turn figures as a local run's metrics.json.

        The words (turns' text, the LLM's history and the summary of what it compacted) only with
        ``server.log_transcripts``; ``usage``: every token the LLM spent on the session (summaries included).
        """
        shows_history = self.limits.log_transcripts and isinstance(self.pipeline.llm, LLMStage)  # it keeps one
        return {"id": self.id, "status": self.status, "started_at": round(self.started_at, 3),
                "pipeline": self.pipeline.index, "tts": "own" if self._own_tts is not None else "pooled",
                "responses_completed": self.responses_completed, "responses_cancelled": self.responses_cancelled,
                "summary": self.recorder.summary(), "turns": self.recorder.records(),
                "metrics_path": str(self.recorder.metrics_path), "usage": self.chat.usage.as_dict(),
                "history": self.chat.history(HISTORY_SHOWN) if shows_history else None,
                "history_summary": self.chat.summary if shows_history else None}

"""Outbox messages -> server events: what the client hears of its graph, in protocol terms.

The translator runs in the session's writer (the event loop). It keeps the session's responses
(:class:`~s2s.server.responses.ResponseQueue`) moving with what the graph produces, and turns each step of
theirs into the events the Realtime protocol has for it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from s2s import audio
from s2s.llm.base import LLMStage
from s2s.metrics import Recorder
from s2s.server import protocol
from s2s.server.outbox import (CancelReply, Close, GraphEnded, OutboxMessage, ReplyOver, ReplySound, ReplyWords,
                               Send, ToolCalled, ToolOutputs, UserHeard, UserStarted, UserStopped)
from s2s.server.protocol import ProtocolError, event
from s2s.server.responses import Finished, Opened, Output, Response, ResponseQueue, State, Step
from s2s.server.session_settings import SessionSettings
from s2s.server.stages import PIPELINE_RATE
from s2s.server.tools import ToolBridge

log = logging.getLogger("s2s.server")

DELTA_S = 0.25  # longest audio delta sent; a TTS block of several seconds is split

Events = list[dict[str, Any]]


class Translator:
    """Turns a session's outbox messages into server events.

    Args:
        session_id: the session's id (its user items are named after it).
        responses: the session's responses (the handlers read it too: is one active?).
        tools: the session's client tools (calls are recorded, outputs delivered, waits released).
        recorder: the session's metrics (a spoken turn's duration).
        llm: the session's LLM (a cancelled reply keeps what was said in its history).
        settings: the session's current settings (output rate, whether speech interrupts a reply).
        input_samples: samples fed to the graph so far, at :data:`PIPELINE_RATE` (the input clock).
    """

    def __init__(self, session_id: str, responses: ResponseQueue, tools: ToolBridge, recorder: Recorder,
                 llm: Any, settings: Callable[[], SessionSettings], input_samples: Callable[[], int]) -> None:
        self.session_id, self.responses, self.tools, self.recorder, self.llm = (session_id, responses, tools,
                                                                               recorder, llm)
        self.settings, self.input_samples = settings, input_samples
        self.typed_turns: set[int] = set()  # turns typed by the client: no transcription event for them
        self._handlers: dict[type, Callable[[Any], Events]] = {
            Send: lambda message: [message.event], UserStarted: self._user_started,
            UserStopped: self._user_stopped, UserHeard: self._user_heard,
            ReplyWords: lambda message: self._steps(self.responses.output(message.turn, message)),
            ReplySound: lambda message: self._steps(self.responses.output(message.audio.turn, message)),
            ReplyOver: lambda message: self._steps(self.responses.complete(message.turn)),
            ToolCalled: self._tool_called, ToolOutputs: self._tool_outputs,
            CancelReply: lambda message: self._steps(self.responses.cancel(message.turn, message.reason)),
            GraphEnded: self._graph_ended,
        }

    def translate(self, message: OutboxMessage) -> Events:
        """The server events for one outbox message, in order (none for a piece of a cancelled reply).

        Args:
            message: anything but :class:`~s2s.server.outbox.Close`, which ends the writer before this.

        Returns:
            JSON-ready server events.
        """
        assert not isinstance(message, Close)
        return self._handlers[type(message)](message)

    # ------------------------------------------------------------------ the user's side
    def _user_item(self, turn: int) -> str:
        return protocol.user_item_id(self.session_id, turn)

    def _user_started(self, message: UserStarted) -> Events:
        out = [event("input_audio_buffer.speech_started", item_id=self._user_item(message.turn),
                     audio_start_ms=self.input_samples() * 1000 // PIPELINE_RATE)]
        if self.settings().turn_detection.interrupt_response:  # the graph's barge_in follows the same setting
            steps = self.responses.barge_in(message.turn)
            if steps:
                self.tools.release()  # a call of a cancelled reply must not keep the LLM waiting
            out += self._steps(steps)
        return out

    def _user_stopped(self, message: UserStopped) -> Events:
        return [event("input_audio_buffer.speech_stopped", item_id=self._user_item(message.turn),
                      audio_end_ms=int(message.end_s * 1000))]

    def _user_heard(self, message: UserHeard) -> Events:
        out = []
        if message.turn not in self.typed_turns:
            record = self.recorder.turns.get(message.turn)
            seconds = round(record.user_audio_s or 0.0, 3) if record else 0.0
            out.append(event("conversation.item.input_audio_transcription.completed",
                             item_id=self._user_item(message.turn), content_index=0, transcript=message.text,
                             usage={"type": "duration", "seconds": seconds}))
        return out + self._steps(self.responses.add(message.turn, message.text))

    # ------------------------------------------------------------------ tools
    def _tool_called(self, message: ToolCalled) -> Events:
        turn = self.responses.newest_open_turn()  # the LLM works on the newest turn
        return [] if turn is None else self._steps(self.responses.complete(turn, message))

    def _tool_outputs(self, message: ToolOutputs) -> Events:
        """Outputs for a waiting LLM: a new response for the same turn, then the LLM goes on."""
        call = self.tools.call(message.outputs[0][0])
        assert call is not None  # the handler only sends outputs for calls the LLM waits on
        out = self._steps(self.responses.add(call.turn))
        for call_id, output in message.outputs:
            if not self.tools.deliver(call_id, output):
                log.info("session %s: output for %s came too late", self.session_id, call_id)
        return out

    # ------------------------------------------------------------------ the graph
    def _graph_ended(self, message: GraphEnded) -> Events:
        failure = message.result.failure
        if failure is None:
            return []
        log.error("session %s: %s", self.session_id, failure)
        error = ProtocolError("server_error", f"the session's pipeline stopped: {failure}")
        return self._steps(self.responses.fail_all()) + [protocol.error_event(error)]

    # ------------------------------------------------------------------ responses
    def _steps(self, steps: list[Step]) -> Events:
        out: Events = []
        for step in steps:
            if isinstance(step, Opened):
                out.append(event("response.created", response=protocol.response_object(step.response.id,
                                                                                         State.ACTIVE.value)))
            elif isinstance(step, Output):
                out += self._output(step.response, step.part)
            elif isinstance(step, Finished) and step.announced:
                out += self._finished(step.response)
        return out

    def _output(self, response: Response, part: ReplyWords | ReplySound | ToolCalled) -> Events:
        ids = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        if isinstance(part, ReplyWords):
            delta = (" " if response.transcript else "") + part.text
            response.transcript.append(part.text)
            return [event("response.output_audio_transcript.delta", delta=delta, **ids)]
        if isinstance(part, ReplySound):
            rate = self.settings().output_rate
            samples = audio.float_to_int16(audio.resample(part.audio.samples, part.audio.sample_rate, rate))
            response.audio_s += len(samples) / rate
            step = max(1, int(DELTA_S * rate))
            return [event("response.output_audio.delta", delta=protocol.encode_audio(samples[i:i + step]), **ids)
                    for i in range(0, len(samples), step)]
        # a call ends the response; its output and response.create continue the turn
        self.tools.record(part, response.turn)
        item = protocol.function_call_item(protocol.new_id("item"), part.call_id, part.name, part.arguments)
        response.calls.append(item)
        return [event("response.function_call_arguments.done", response_id=response.id, item_id=item["id"],
                      output_index=len(response.calls), call_id=part.call_id, name=part.name,
                      arguments=part.arguments)]

    def _finished(self, response: Response) -> Events:
        status = response.state.value
        ids = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        transcript = " ".join(response.transcript)
        message = protocol.assistant_item(response.item_id, transcript, response.state is State.COMPLETED)
        output = [message, *response.calls]
        if response.state is State.CANCELLED and response.user_text is not None and isinstance(self.llm, LLMStage):
            # what reached the client stays in the history, the rest of the reply does not
            self.llm.remember(response.turn, response.user_text, transcript)
        log.info("session %s: response %s %s (%.2f s of audio)%s", self.session_id, response.id[-6:], status,
                 response.audio_s, f", {response.reason}" if response.reason else "")
        return [event("response.output_audio.done", **ids),
                event("response.output_audio_transcript.done", transcript=transcript, **ids),
                event("response.done", response=protocol.response_object(response.id, status, output,
                                                                         response.reason))]

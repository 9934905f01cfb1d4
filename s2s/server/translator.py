"""Outbox messages -> server events: what the client hears of its graph, in protocol terms.

The translator runs in the session's writer (the event loop). It keeps the session's responses
(:class:`~s2s.server.responses.ResponseQueue`) moving with what the graph produces, turns each step of theirs
into the events the Realtime protocol has for it, and keeps the conversation's items
(:class:`~s2s.server.items.Items`) as the client sees them: each user turn, reply and tool call is
an item announced with ``conversation.item.added`` / ``.done`` and, inside a response, with
``response.output_item.added`` / ``.done`` (the Agents SDKs run a tool when its call's item is done).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from s2s import audio
from s2s.chat_context import ChatContext
from s2s.metrics import Recorder
from s2s.server import protocol
from s2s.server.items import Items
from s2s.server.partials import new_suffix
from s2s.server.idle import IdleTimer
from s2s.server.outbox import (CancelReply, Close, Committed, GraphEnded, ItemAdded, ItemAsked, ItemsAnswered,
                               OutboxMessage, ReplyOver, ReplySound, ReplyWords, Send, TokensUsed, ToolCalled,
                               ToolOutputs, UserHeard, UserIdle, UserNotHeard, UserPartial, UserStarted, UserStopped)
from s2s.server.protocol import ProtocolError, ResponseRequest, event
from s2s.server.responses import Finished, Opened, Output, Response, ResponseQueue, State, Step
from s2s.server.session_settings import SessionSettings
from s2s.server.stages import PIPELINE_RATE
from s2s.server.tools import ToolBridge
from s2s.server.visemes import VisemeTrack, visemes_event

log = logging.getLogger("s2s.server")

DELTA_S = 0.25  # longest audio delta sent; a TTS block of several seconds is split

Events = list[dict[str, Any]]


def _user_audio_item(item_id: str, transcript: str | None, done: bool) -> dict[str, Any]:
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
            "status": "completed" if done else "in_progress",
            "content": [{"type": "input_audio", "transcript": transcript}]}


class Translator:
    """Turns a session's outbox messages into server events.

    Args:
        session_id: the session's id (its user items are named after it).
        responses: the session's responses (the handlers read it too: is one active?).
        tools: the session's client tools (calls are recorded, outputs delivered, waits released).
        recorder: the session's metrics (a spoken turn's duration).
        chat: the session's conversation (a cancelled reply keeps what was said in its history).
        settings: the session's current settings (output rate, whether speech interrupts a reply).
        input_samples: samples fed to the graph so far, at :data:`PIPELINE_RATE` (the input clock).
        idle: the session's ``idle_timeout_ms`` timer, told of each reply's audio and end and of the user's speech.
    """

    def __init__(self, session_id: str, responses: ResponseQueue, tools: ToolBridge, recorder: Recorder,
                 chat: ChatContext, settings: Callable[[], SessionSettings],
                 input_samples: Callable[[], int], idle: IdleTimer | None = None,
                 utterance: Callable[[int], int] = lambda turn: turn) -> None:
        self.session_id, self.responses, self.tools, self.recorder, self.chat = (session_id, responses, tools,
                                                                                recorder, chat)
        self.settings, self.input_samples, self.idle = settings, input_samples, idle
        self.utterance = utterance  # a turn -> the first turn of its utterance (the user went on after an attempt)
        self.items = Items(chat)
        self.typed_turns: set[int] = set()  # turns typed by the client: no transcription event for them
        self.idle_turns: set[int] = set()  # the user's silence after a reply (idle_timeout_ms): heard as nothing
        self.requests: dict[int, ResponseRequest] = {}  # what a client's response.create asked for its turn
        self._committed: set[int] = set()  # manual turns: announced at the client's commit
        self._partial: dict[int, str] = {}  # spoken utterances: the transcript deltas sent so far, joined
        self._handlers: dict[type, Callable[[Any], Events]] = {
            Send: lambda message: [message.event], UserStarted: self._user_started,
            UserStopped: self._user_stopped, UserPartial: self._user_partial, UserHeard: self._user_heard,
            UserNotHeard: self._user_not_heard, UserIdle: self._user_idle, Committed: self._committed_turn,
            ReplyWords: lambda message: self._steps(self.responses.output(message.turn, message)),
            ReplySound: lambda message: self._steps(self.responses.output(message.audio.turn, message)),
            ReplyOver: lambda message: self._steps(self.responses.complete(message.turn)),
            ToolCalled: self._tool_called, ToolOutputs: self._tool_outputs,
            CancelReply: lambda message: self._steps(self.responses.cancel(message.turn, message.reason)),
            GraphEnded: self._graph_ended, ItemAdded: self._item_added,
            ItemsAnswered: lambda message: self.items.assign(message.turn, message.item_ids) or [],
            ItemAsked: lambda message: self.items.answer(message.request),
            TokensUsed: lambda message: self.responses.charge(message.turn, message.usage) or [],
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
        """One item per utterance: the attempts the user went on from share it with the turn that stood."""
        return protocol.user_item_id(self.session_id, self.utterance(turn))

    def _user_started(self, message: UserStarted) -> Events:
        if self.idle is not None:
            self.idle.cancel()
        out = [event("input_audio_buffer.speech_started", item_id=self._user_item(message.turn),
                     audio_start_ms=self.input_samples() * 1000 // PIPELINE_RATE)]
        if self.settings().turn_detection.interrupt_response:  # the graph's barge_in follows the same setting
            steps = self.responses.barge_in(message.turn)
            if steps:
                self.tools.release()  # a call of a cancelled reply must not keep the LLM waiting
            out += self._steps(steps)
        return out

    def _announce_user_item(self, turn: int) -> Events:
        """``input_audio_buffer.committed`` and the user's audio item, still without its transcript."""
        item_id = self._user_item(turn)
        previous = self.items.add(_user_audio_item(item_id, None, False), turn, "user")
        return [event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous),
                event("conversation.item.added", previous_item_id=previous,
                      item=_user_audio_item(item_id, None, False))]

    def _committed_turn(self, message: Committed) -> Events:
        if self.idle is not None:
            self.idle.cancel()
        self._committed.add(message.turn)
        return self._announce_user_item(message.turn)

    def _user_idle(self, message: UserIdle) -> Events:
        """``input_audio_buffer.timeout_triggered`` with the silent span, then that silence as a user item."""
        self.idle_turns.add(message.turn)
        end_ms = int(message.end_s * 1000)
        return [event("input_audio_buffer.timeout_triggered", item_id=self._user_item(message.turn),
                      audio_start_ms=max(0, end_ms - round(message.timeout_s * 1000)), audio_end_ms=end_ms),
                *self._announce_user_item(message.turn)]

    def _user_not_heard(self, message: UserNotHeard) -> Events:
        """The STT failed on the turn: ``...input_audio_transcription.failed``; its item is done, untranscribed."""
        if message.turn in self.typed_turns:
            return []
        item_id = self._user_item(message.turn)
        self._partial.pop(self.utterance(message.turn), None)
        out = []
        if self.settings().transcription:
            out.append(event("conversation.item.input_audio_transcription.failed", item_id=item_id, content_index=0,
                             error={"type": "transcription_error", "code": "transcription_failed",
                                    "message": "the speech recognition of this turn failed, so it gets no reply; "
                                               "the session goes on", "param": None}))
        if (entry := self.items.get(item_id)) is not None:
            entry.item.update(_user_audio_item(item_id, None, True))
            out.append(event("conversation.item.done", previous_item_id=self.items.before(item_id),
                             item=entry.item))
        return out

    def _user_stopped(self, message: UserStopped) -> Events:
        if message.turn in self._committed:  # a manual turn: the client's commit announced it
            return []
        # the speaker went on after a turn that ended too soon: its items (and its cut reply's) are void, this
        # turn's item holds the whole (the LLM's history forgets them too)
        void = self.items.forget(message.resumes) if message.resumes is not None else []
        return [event("input_audio_buffer.speech_stopped", item_id=self._user_item(message.turn),
                      audio_end_ms=int(message.end_s * 1000)),
                *[event("conversation.item.deleted", item_id=item_id) for item_id in void],
                *self._announce_user_item(message.turn)]

    def _transcript_delta(self, turn: int, text: str) -> Events:
        """A delta with what ``text`` adds to the deltas of ``turn`` so far; none when it revises them."""
        utterance = self.utterance(turn)
        sent = self._partial.get(utterance, "")
        suffix = new_suffix(sent, text)
        if not suffix:
            return []
        self._partial[utterance] = sent + suffix
        return [event("conversation.item.input_audio_transcription.delta", item_id=self._user_item(turn),
                      content_index=0, delta=suffix)]

    def _user_partial(self, message: UserPartial) -> Events:
        if message.turn in self.typed_turns or not self.settings().transcription:
            return []
        for turn in [turn for turn in self._partial if turn < self.utterance(message.turn) - 8]:  # cleared ones
            del self._partial[turn]
        return self._transcript_delta(message.turn, message.text)

    def _user_heard(self, message: UserHeard) -> Events:
        out = []
        if message.turn not in self.typed_turns:
            item_id = self._user_item(message.turn)
            shown = self.settings().transcription
            heard = "" if message.turn in self.idle_turns else message.text  # silence has no words
            if shown:
                record = self.recorder.turns.get(message.turn)
                seconds = round(record.user_audio_s or 0.0, 3) if record else 0.0
                out += [*self._transcript_delta(message.turn, heard),
                        event("conversation.item.input_audio_transcription.completed", item_id=item_id,
                              content_index=0, transcript=heard,
                              usage={"type": "duration", "seconds": seconds})]
            self._partial.pop(self.utterance(message.turn), None)
            item = _user_audio_item(item_id, heard if shown else None, True)
            if (entry := self.items.get(item_id)) is not None:
                entry.item.update(item)
                out.append(event("conversation.item.done", previous_item_id=self.items.before(item_id),
                                 item=item))
        request = self.requests.get(message.turn, ResponseRequest())
        return out + self._steps(self.responses.add(message.turn, message.text, request.out_of_band,
                                                    request.metadata, self._text_only(request)))

    def _text_only(self, request: ResponseRequest) -> bool:
        """The response's output_modalities is ["text"]: its own, else the session's."""
        return self.settings().text_only if request.text_only is None else request.text_only

    def _item_added(self, message: ItemAdded) -> Events:
        """A client's item: ``conversation.item.created`` (the beta name) and the GA ``added`` / ``done``."""
        item = message.item
        previous = self.items.add(item, message.turn, item.get("role") if item["type"] == "message" else None)
        return [event(kind, previous_item_id=previous, item=item)
                for kind in ("conversation.item.created", "conversation.item.added", "conversation.item.done")]

    # ------------------------------------------------------------------ tools
    def _tool_called(self, message: ToolCalled) -> Events:
        turn = self.responses.newest_open_turn()  # the LLM works on the newest turn
        return [] if turn is None else self._steps(self.responses.complete(turn, message))

    def _tool_outputs(self, message: ToolOutputs) -> Events:
        """Outputs for a waiting LLM: a new response for the same turn, then the LLM goes on."""
        call = self.tools.call(message.outputs[0][0])
        assert call is not None  # the handler only sends outputs for calls the LLM waits on
        request = self.requests.get(call.turn, ResponseRequest())
        out = self._steps(self.responses.add(call.turn, None, request.out_of_band, request.metadata,
                                             self._text_only(request)))
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
                out += self._opened(step.response)
            elif isinstance(step, Output):
                out += self._output(step.response, step.part)
            elif isinstance(step, Finished) and step.announced:
                out += self._finished(step.response)
                if self.idle is not None:  # its audio all sent: the user's silence is timed from its end, unless
                    # the user cut it short by speaking, or it called a tool (the client's output continues it)
                    response = step.response
                    self.idle.reply_finished(response.reason != "turn_detected" and not response.calls)
        return out

    def _added(self, response: Response, item: dict[str, Any], output_index: int, role: str | None) -> Events:
        out = [event("response.output_item.added", response_id=response.id, output_index=output_index, item=item)]
        if not response.out_of_band:
            previous = self.items.add(dict(item), response.turn, role, response if role else None)
            out.append(event("conversation.item.added", previous_item_id=previous, item=item))
        return out

    def _done(self, response: Response, item: dict[str, Any], output_index: int) -> Events:
        if not response.out_of_band and (entry := self.items.get(item["id"])) is not None:
            entry.item.update({"status": item["status"]} if entry.edited else item)  # a truncation stands
            item = entry.item
        out = [event("response.output_item.done", response_id=response.id, output_index=output_index, item=item)]
        if not response.out_of_band:
            out.append(event("conversation.item.done", previous_item_id=self.items.before(item["id"]),
                             item=item))
        return out

    def _opened(self, response: Response) -> Events:
        if self.idle is not None:
            self.idle.cancel()
        shown = protocol.response_object(response.id, State.ACTIVE.value, metadata=response.metadata,
                                         out_of_band=response.out_of_band, text_only=response.text_only)
        item = {**protocol.assistant_item(response.item_id, "", True), "status": "in_progress", "content": []}
        response.visemes = VisemeTrack() if self.settings().visemes else None  # its timeline starts with it
        part = {"type": "text", "text": ""} if response.text_only else {"type": "audio", "transcript": ""}
        return [event("response.created", response=shown), *self._added(response, item, 0, "assistant"),
                event("response.content_part.added", response_id=response.id, item_id=response.item_id,
                      output_index=0, content_index=0, part=part)]

    def _output(self, response: Response, part: ReplyWords | ReplySound | ToolCalled) -> Events:
        ids = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        if isinstance(part, ReplyWords):
            delta = (" " if response.transcript else "") + part.text
            response.transcript.append(part.text)
            response.chunks[part.chunk if part.chunk >= 0 else len(response.chunks)] = part.text
            kind = "response.output_text.delta" if response.text_only else "response.output_audio_transcript.delta"
            return [event(kind, delta=delta, **ids)]
        if isinstance(part, ReplySound) and response.text_only:
            return []  # a text-only reply has no audio (the TTS passes its text by)
        if isinstance(part, ReplySound):
            rate, resampler = self.settings().output_rate, response.resampler
            tail: Events = []
            if resampler is None or (resampler.rate_in, resampler.rate_out) != (part.audio.sample_rate, rate):
                tail = self._sound(response, max(response.chunks, default=0))  # the old stream's end
                response.resampler = resampler = audio.StreamResampler(part.audio.sample_rate, rate)
            chunk = part.chunk if part.chunk >= 0 else max(response.chunks, default=0)
            return tail + self._sound(response, chunk, resampler.feed(part.audio.samples))
        # a call ends the response; its output and response.create continue the turn
        self.tools.record(part, response.turn)
        item = protocol.function_call_item(protocol.new_id("item"), part.call_id, part.name, part.arguments)
        response.calls.append(item)
        index = len(response.calls)
        return [*self._added(response, {**item, "status": "in_progress", "arguments": ""}, index, None),
                event("response.function_call_arguments.done", response_id=response.id, item_id=item["id"],
                      output_index=index, call_id=part.call_id, name=part.name, arguments=part.arguments),
                *self._done(response, item, index)]

    def _sound(self, response: Response, chunk: int, floats: np.ndarray | None = None) -> Events:
        """Audio deltas of ``floats``, already at the client's rate (None: the end of the reply's resampler)."""
        if floats is None:
            if response.resampler is None:
                return []
            floats = response.resampler.flush()
        rate = response.resampler.rate_out
        samples = audio.float_to_int16(floats)
        response.audio_s += len(samples) / rate
        if self.idle is not None:
            self.idle.reply_audio(len(samples) / rate)
        response.chunk_audio[chunk] = response.chunk_audio.get(chunk, 0.0) + len(samples) / rate
        ids = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        step = max(1, int(DELTA_S * rate))
        cues = response.visemes.feed(floats, rate) if response.visemes is not None else []
        return [*([visemes_event(ids, cues)] if cues else []),  # the block's shapes, ahead of its audio
                *[event("response.output_audio.delta", delta=protocol.encode_audio(samples[i:i + step]), **ids)
                  for i in range(0, len(samples), step)]]

    def _finished(self, response: Response) -> Events:
        status = response.state.value
        ids = {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}
        transcript = " ".join(response.transcript)
        message = protocol.assistant_item(response.item_id, transcript, response.state is State.COMPLETED,
                                          response.text_only)
        output = [message, *response.calls]
        if response.state is State.CANCELLED and response.user_text is not None and not response.out_of_band:
            # what reached the client stays in the history, the rest of the reply does not
            self.chat.remember(response.turn, response.user_text, transcript)
        log.info("session %s: response %s %s (%.2f s of audio)%s", self.session_id, response.id[-6:], status,
                 response.audio_s, f", {response.reason}" if response.reason else "")
        shown = protocol.response_object(response.id, status, output, response.reason, response.metadata,
                                         response.out_of_band, response.text_only, response.usage)
        if response.text_only:
            return [event("response.output_text.done", text=transcript, **ids),
                    event("response.content_part.done", **ids, part={"type": "text", "text": transcript}),
                    *self._done(response, message, 0), event("response.done", response=shown)]
        # a completed reply's last milliseconds, which the resampler held back (a cancelled one stops where it was)
        tail = self._sound(response, max(response.chunks, default=0)) if response.state is State.COMPLETED else []
        return [*tail, event("response.output_audio.done", **ids),
                event("response.output_audio_transcript.done", transcript=transcript, **ids),
                event("response.content_part.done", **ids, part={"type": "audio", "transcript": transcript}),
                *self._done(response, message, 0),
                event("response.done", response=shown)]

"""Outbox messages in, server events out: the translator and the outbox, without a socket or a graph."""
from __future__ import annotations

import asyncio
import base64
import threading

import numpy as np

from s2s import metrics
from s2s.graph import RunResult, StageFailure
from s2s.llm.echo import EchoLM
from s2s.messages import ReplyAudio, ReplyText, SpeechSegment, Transcript, TurnConfirmed, TurnDiscarded
from s2s.server.outbox import (CancelReply, GraphEnded, GraphObserver, Outbox, ReplyOver, ReplySound, ReplyWords,
                               Send, ToolCalled, ToolOutputs, UserHeard, UserStarted, UserStopped)
from s2s.server.protocol import TurnDetection
from s2s.server.responses import ResponseQueue
from s2s.server.session_settings import SessionSettings
from s2s.server.tools import ToolBridge
from s2s.server.translator import DELTA_S, Translator
from s2s.turn_gate import TurnGate

TOOL = {"type": "function", "name": "get_weather", "description": "", "parameters": {"type": "object"}}


class Recorder:
    """What the translator reads of the metrics: nothing recorded (a spoken turn's duration is then 0)."""

    turns: dict = {}

    def on_input(self, *args):
        pass

    on_done = on_output = on_metric = on_input


def translator(interrupt=True):
    llm = EchoLM()
    llm.history_turns = 2
    settings = SessionSettings(instructions=None, voice="jf_alpha",
                               turn_detection=TurnDetection(interrupt_response=interrupt))
    calls = []
    tools = ToolBridge(llm, llm.context, calls.append)
    return Translator("sess_0123456789", ResponseQueue(), tools, Recorder(), llm.context, lambda: settings,
                      lambda: 32000)


# the items' own events (what the Agents SDKs keep their history and run their tools from): the tests below
# follow the responses without them; test_every_item_is_announced_added_and_done follows them
ITEM_EVENTS = {"input_audio_buffer.committed", "conversation.item.added", "conversation.item.done",
               "response.output_item.added", "response.output_item.done", "response.content_part.added",
               "response.content_part.done", "conversation.item.input_audio_transcription.delta"}


def run(translate, *messages, items=False):
    events = []
    for message in messages:
        events += translate.translate(message)
    return [event for event in events if items or event["type"] not in ITEM_EVENTS]


def types(events, items=False):
    return [event["type"] for event in events if items or event["type"] not in ITEM_EVENTS]


def test_a_spoken_turn_and_its_reply():
    t = translator()
    events = run(t, UserStarted(0), UserStopped(0, 1.5), UserHeard(0, "Hello?"), ReplyWords(0, "Hi."),
                 ReplyWords(0, "How are you?"), ReplySound(ReplyAudio(np.zeros(24000, np.float32), 24000, 0)),
                 ReplyOver(0))
    assert types(events) == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                             "conversation.item.input_audio_transcription.completed", "response.created",
                             "response.output_audio_transcript.delta", "response.output_audio_transcript.delta",
                             *["response.output_audio.delta"] * int(1 / DELTA_S), "response.output_audio.done",
                             "response.output_audio_transcript.done", "response.done"]
    assert events[0]["audio_start_ms"] == 2000 and events[1]["audio_end_ms"] == 1500  # the input clock
    assert events[0]["item_id"] == events[2]["item_id"] == "item_23456789_0"
    assert [e["delta"] for e in events[4:6]] == ["Hi.", " How are you?"]
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert len(audio) == 2 * 24000  # PCM16 at the session's output rate
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["transcript"] == "Hi. How are you?"
    assert t.responses.counts["completed"] == 1


def test_a_typed_turn_has_no_transcription_event():
    t = translator()
    t.typed_turns.add(3)
    assert types(run(t, UserHeard(3, "Typed."))) == ["response.created"]


def test_speech_over_a_reply_cancels_it_when_it_may_interrupt():
    t = translator()
    run(t, UserHeard(0, "Tell me a story."), ReplyWords(0, "Once upon a time."))
    events = run(t, UserStarted(1))
    assert types(events) == ["input_audio_buffer.speech_started", "response.output_audio.done",
                             "response.output_audio_transcript.done", "response.done"]
    assert events[-1]["response"]["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"
    assert run(t, ReplyWords(0, "There was a dog.")) == []  # nothing more of it reaches the client
    # what the client heard stays in the LLM's history
    assert {"role": "assistant", "content": "Once upon a time."} in t.tools.llm.chat_messages("And then?")
    quiet = translator(interrupt=False)
    run(quiet, UserHeard(0, "Tell me a story."))
    assert types(run(quiet, UserStarted(1))) == ["input_audio_buffer.speech_started"]


def test_a_cancelled_reply_ends_and_the_next_turn_is_answered():
    t = translator()
    first = run(t, UserHeard(0, "One."))[-1]["response"]["id"]
    assert types(run(t, UserHeard(1, "Two."))) == ["conversation.item.input_audio_transcription.completed"]
    events = run(t, CancelReply(0, "client_cancelled"))
    assert types(events) == ["response.output_audio.done", "response.output_audio_transcript.done",
                             "response.done", "response.created"]
    assert events[2]["response"]["id"] == first and events[3]["response"]["id"] != first


def test_a_tool_call_ends_the_response_and_the_outputs_continue_the_turn():
    t = translator()
    t.tools.install([TOOL], "auto")
    run(t, UserHeard(0, "Weather in Paris?"))
    events = run(t, ToolCalled("call_1", "get_weather", '{"city": "Paris"}'))
    assert types(events) == ["response.function_call_arguments.done", "response.output_audio.done",
                             "response.output_audio_transcript.done", "response.done"]
    assert events[0]["call_id"] == "call_1" and events[0]["output_index"] == 1
    call_item = events[-1]["response"]["output"][-1]
    assert (call_item["type"], call_item["call_id"], call_item["name"]) == ("function_call", "call_1", "get_weather")
    assert t.tools.call("call_1").turn == 0  # recorded: the client's output may name it
    events = run(t, ToolOutputs((("call_1", "sunny"),)))  # no LLM thread waits here: delivered too late
    assert types(events) == ["response.created"]
    assert types(run(t, ReplyWords(0, "It is sunny."), ReplyOver(0)))[-1] == "response.done"


def test_a_stopped_graph_fails_what_is_open_and_says_why():
    t = translator()
    run(t, UserHeard(0, "Hello?"))
    failure = StageFailure("tts", RuntimeError("boom"), "")
    events = run(t, GraphEnded(RunResult("failed", failure)))
    assert types(events) == ["response.output_audio.done", "response.output_audio_transcript.done",
                             "response.done", "error"]
    assert events[2]["response"]["status"] == "failed" and "boom" in events[-1]["error"]["message"]
    assert run(t, GraphEnded(RunResult("completed"))) == []
    assert run(t, Send({"type": "session.updated"})) == [{"type": "session.updated"}]


def test_the_outbox_keeps_the_order_of_puts_from_any_thread_and_outlives_its_loop():
    async def main():
        outbox = Outbox(asyncio.get_running_loop())
        outbox.put(Send({"n": 0}))
        thread = threading.Thread(target=lambda: [outbox.put(Send({"n": n})) for n in (1, 2)])
        thread.start()
        thread.join()
        outbox.put(Send({"n": 3}))
        return outbox, [(await outbox.get()).event["n"] for _ in range(4)]

    outbox, order = asyncio.run(main())
    assert order == [0, 1, 2, 3]
    outbox.put(Send({"n": 4}))  # the loop is closed: nothing to tell, and no error


def test_the_observer_follows_the_gate_and_sends_a_turns_words_before_its_audio(tmp_path):
    put = []

    class Box:
        def put(self, message):
            put.append(message)

    gate = TurnGate(deliver=lambda message: put.append(("sink", message)))
    recorder = metrics.Recorder(tmp_path)
    observer = GraphObserver(recorder, Box(), "vad", "sink")
    observer.watch(gate)

    def emit(stage, message):  # as the graph does: the gate first, then the observers
        gate.observe(message)
        observer.on_output(stage, message, 0.0)

    segment = SpeechSegment(np.zeros(160, np.float32), 16000, 0, 0.0, 0.5, speculative=True)
    emit("vad", segment)
    emit("stt", Transcript("Hello", 0))
    sound = ReplyAudio(np.zeros(160, np.float32), 16000, 0)
    gate.admit(sound)  # the reply's audio, bound for the sink: held with the turn
    assert put == []
    emit("vad", TurnConfirmed(0, 0.7))
    assert put == [UserStopped(0, 0.5), UserHeard(0, "Hello"), ("sink", sound)]  # words, then audio
    again = SpeechSegment(np.zeros(160, np.float32), 16000, 1, 1.0, 1.5, speculative=True)
    emit("vad", again)
    emit("stt", Transcript("Hel", 1))
    emit("vad", TurnDiscarded(1))
    emit("llm", ReplyText("Late.", 1))
    assert put[3:] == []  # the discarded attempt never reaches the client, nor does late news of it
    assert sorted(recorder.turns) == [0]  # the Recorder follows the same gate: the attempt left no record


def test_reply_audio_is_resampled_as_one_stream_without_clicks_at_block_edges():
    import soxr

    t = translator()  # the session's output rate is 24 kHz; this TTS speaks at 22.05 kHz, in uneven blocks
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(22050) / 22050)).astype(np.float32)
    edges = [0, 1000, 4410, 4411, 9000, 15000, 22050]
    blocks = [ReplySound(ReplyAudio(tone[a:b], 22050, 0)) for a, b in zip(edges, edges[1:])]
    events = run(t, UserHeard(0, "Hum."), ReplyWords(0, "Hmm."), *blocks, ReplyOver(0))
    sent = np.frombuffer(b"".join(base64.b64decode(e["delta"]) for e in events
                                  if e["type"] == "response.output_audio.delta"), np.int16) / 32767
    whole = soxr.resample(tone, 22050, 24000)
    assert len(sent) == len(whole)  # the resampler's held-back tail was sent before output_audio.done
    assert np.max(np.abs(sent - whole)) < 1e-3  # as if resampled at once: no filter restart at any edge
    per_block = np.concatenate([soxr.resample(tone[a:b], 22050, 24000) for a, b in zip(edges, edges[1:])])
    assert np.max(np.abs(per_block[:len(whole)] - whole)) > 10 * np.max(np.abs(sent - whole))  # what it was
    assert events[-1]["response"]["status"] == "completed"

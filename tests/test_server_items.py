"""The conversation's items, their events, and the client's edits of them, without a socket or a graph.

Every server event is checked against the ``openai`` SDK's own schema of server events: the Agents SDK for
Python validates each event it receives with it, and reports an error for one that does not fit.
"""
from __future__ import annotations

import numpy as np
import pytest

from s2s.chat_context import KEEP
from s2s.llm.echo import EchoLM
from s2s.messages import ReplyAudio, Transcript
from s2s.server.outbox import (CancelReply, Committed, ItemAdded, ItemAsked, ItemsAnswered, ReplyOver, ReplySound,
                               ReplyWords, TokensUsed, ToolCalled, UserHeard, UserStarted, UserStopped)
from s2s.server.protocol import ItemRequest, ResponseRequest, TurnDetection, user_text_item
from s2s.server.responses import Response, ResponseQueue
from s2s.server.session_settings import SessionSettings
from s2s.server.tools import ToolBridge
from s2s.server.translator import Translator

TOOL = {"type": "function", "name": "get_weather", "description": "", "parameters": {"type": "object"}}


class Recorder:
    turns: dict = {}


def translator(transcription=True, turns=2):
    llm = EchoLM()
    llm.history_turns = turns
    settings = SessionSettings(instructions=None, voice=None, transcription=transcription,
                               turn_detection=TurnDetection())
    return Translator("sess_0123456789", ResponseQueue(), ToolBridge(llm, llm.context, lambda call: None),
                      Recorder(), llm.context, lambda: settings, lambda: 32000)


def run(t, *messages):
    events = []
    for message in messages:
        events += t.translate(message)
    return events


def sound(seconds, turn=0):
    return ReplyAudio(np.zeros(int(24000 * seconds), np.float32), 24000, turn)


@pytest.fixture(scope="module")
def schema():
    from openai.types.realtime import RealtimeServerEvent
    from pydantic import TypeAdapter

    return TypeAdapter(RealtimeServerEvent)


def test_a_spoken_turn_its_reply_and_a_tool_call_are_items_the_sdk_schema_accepts(schema):
    t = translator()
    t.tools.install([TOOL], "auto")
    events = run(t, UserStarted(0), UserStopped(0, 1.5), UserHeard(0, "Weather?"), ReplyWords(0, "Let me see.", 0),
                 ReplySound(sound(0.5), 0), ToolCalled("call_1", "get_weather", '{"city": "Paris"}'))
    kinds = [event["type"] for event in events]
    assert kinds == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                     "input_audio_buffer.committed", "conversation.item.added",
                     "conversation.item.input_audio_transcription.delta",
                     "conversation.item.input_audio_transcription.completed", "conversation.item.done",
                     "response.created", "response.output_item.added", "conversation.item.added",
                     "response.content_part.added", "response.output_audio_transcript.delta",
                     "response.output_audio.delta", "response.output_audio.delta",
                     "response.output_item.added", "conversation.item.added", "response.function_call_arguments.done",
                     "response.output_item.done", "conversation.item.done", "response.output_audio.done",
                     "response.output_audio_transcript.done", "response.content_part.done",
                     "response.output_item.done", "conversation.item.done", "response.done"]
    for event in events:
        schema.validate_python(event)
    user = events[3]["item"]
    assert user["id"] == events[2]["item_id"] and events[2]["previous_item_id"] is None
    assert events[6]["item"]["content"][0]["transcript"] == "Weather?"
    assert events[9]["previous_item_id"] == user["id"]  # the reply follows the question
    call_done = events[17]["item"]
    assert (call_done["type"], call_done["status"], call_done["call_id"]) == ("function_call", "completed", "call_1")
    assert events[14]["item"]["status"] == "in_progress"  # the SDKs run the call at its done, once
    assert events[4]["delta"] == "Weather?"


def test_a_client_item_is_created_added_and_done_and_retrieved_as_it_was_sent(schema):
    t = translator()
    item = user_text_item("Hello.")
    events = run(t, ItemAdded(item), ItemAsked(ItemRequest("retrieve", item["id"], "evt_1")),
                 ItemAsked(ItemRequest("retrieve", "item_nope", "evt_2")))
    assert [e["type"] for e in events] == ["conversation.item.created", "conversation.item.added",
                                           "conversation.item.done", "conversation.item.retrieved", "error"]
    for event in events:
        schema.validate_python(event)
    assert events[3]["item"] == item
    assert events[4]["error"]["param"] == "item_id" and events[4]["error"]["event_id"] == "evt_2"


def test_truncation_keeps_the_words_whose_audio_was_heard_in_the_llm_history(schema):
    t = translator()
    run(t, UserStarted(0), UserStopped(0, 1.0), UserHeard(0, "Tell me a story."))
    events = run(t, ReplyWords(0, "Once upon a time.", 0), ReplyWords(0, "There was a small brown dog.", 1),
                 ReplySound(sound(1.0), 0), ReplySound(sound(1.2), 1), ReplySound(sound(0.8), 1))
    item_id = events[0]["item_id"]
    run(t, UserStarted(1))  # the user speaks over it: cancelled, what was sent stays for now
    assert t.chat.history()[-1]["content"] == "Once upon a time. There was a small brown dog."
    cut = run(t, ItemAsked(ItemRequest("truncate", item_id, "evt_1", audio_end_ms=1500)))
    assert [e["type"] for e in cut] == ["conversation.item.truncated"]
    schema.validate_python(cut[0])
    # 1.0 s of the first piece, then 0.5 s of the second's 2.0 s: a quarter of its six words
    assert t.chat.history()[-1] == {"role": "assistant", "content": "Once upon a time. There was"}
    retrieved = run(t, ItemAsked(ItemRequest("retrieve", item_id, None)))[0]
    assert retrieved["item"]["content"][0]["transcript"] == "Once upon a time. There was"
    too_far = run(t, ItemAsked(ItemRequest("truncate", item_id, "evt_2", audio_end_ms=9000)))[0]
    assert too_far["type"] == "error" and too_far["error"]["param"] == "audio_end_ms"


def test_a_truncation_before_the_cancelled_reply_is_remembered_still_stands():
    llm = EchoLM()
    llm.history_turns = 2
    llm.context.edit(0, "assistant", "Once")  # the client's truncate came first
    llm.context.remember(0, "Tell me a story.", "Once upon a time.")  # then the LLM's thread let go of the turn
    assert llm.context.history() == [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once"}]


def test_deleting_items_removes_their_messages_from_the_llm_history():
    t = translator()
    run(t, UserStarted(0), UserStopped(0, 1.0), UserHeard(0, "Hello."))
    reply = run(t, ReplyWords(0, "Hi there.", 0), ReplyOver(0))
    assert t.chat.history() == []  # the echo LLM's thread never ran: remember what it would have
    t.chat.remember(0, "Hello.", "Hi there.")
    events = run(t, ItemAsked(ItemRequest("delete", reply[0]["item_id"], None)))
    assert [e["type"] for e in events] == ["conversation.item.deleted"]
    assert t.chat.history() == [{"role": "user", "content": "Hello."}]
    run(t, ItemAsked(ItemRequest("delete", "item_23456789_0", None)))
    assert t.chat.history() == []
    assert run(t, ItemAsked(ItemRequest("delete", "item_23456789_0", None)))[0]["type"] == "error"


def test_a_turn_the_speaker_went_on_from_is_deleted_and_the_resumed_turn_holds_the_whole(schema):
    t = translator()
    asked = run(t, UserStarted(0), UserStopped(0, 1.0), UserHeard(0, "What is the capital of"))
    run(t, ReplyWords(0, "The capital", 0), ReplySound(sound(0.3), 0))
    run(t, UserStarted(1))  # the speaker went on: barge-in cuts the reply
    events = run(t, UserStopped(1, 2.5, resumes=0), UserHeard(1, "What is the capital of France?"))
    void = {e["item"]["id"] for e in asked if e["type"] == "conversation.item.added"}  # the question, the reply
    assert len(void) == 2
    deleted = [e for e in events if e["type"] == "conversation.item.deleted"]
    assert {e["item_id"] for e in deleted} == void and events[0]["type"] == "input_audio_buffer.speech_stopped"
    for event in events:
        schema.validate_python(event)
    assert all(t.items.get(item_id) is None for item_id in void)
    added = next(e for e in events if e["type"] == "conversation.item.added")
    assert added["previous_item_id"] is None  # nothing of the cut turn is left before it


def test_the_session_vad_numbers_the_turn_a_resumed_utterance_goes_on_from():
    from s2s.messages import AudioChunk, SpeechSegment
    from s2s.server.stages import SessionVAD, TurnCounter

    class Resuming(StubVAD):
        def flush(self):  # every utterance after the first goes on from the one before
            for segment in super().flush():
                yield SpeechSegment(segment.samples, 16000, segment.turn, 0.0, 1.0,
                                    resumes=segment.turn - 1 if segment.turn else None)

    turns = TurnCounter()
    turns.next(), turns.next()  # two typed turns took the session's first numbers
    vad = SessionVAD(Resuming(), turns)
    segments = [m for m in vad.process(AudioChunk(np.array([1, 0, 1, 0], np.float32), 16000))
                if isinstance(m, SpeechSegment)]
    assert [(m.turn, m.resumes) for m in segments] == [(2, None), (3, 2)]


def test_typed_items_become_the_turn_that_answered_them():
    t = translator()
    first, second = user_text_item("Hello."), user_text_item("How are you?")
    run(t, ItemAdded(first), ItemAdded(second), ItemsAnswered(3, (first["id"], second["id"])))
    t.chat.remember(3, "Hello.\nHow are you?", "Fine.")
    run(t, ItemAsked(ItemRequest("delete", first["id"], None)))
    assert t.chat.history()[0] == {"role": "user", "content": "How are you?"}


def test_an_out_of_band_response_stays_out_of_the_conversation():
    t = translator()
    t.typed_turns.add(0)
    t.requests[0] = ResponseRequest(out_of_band=True, metadata={"topic": "summary"})
    events = run(t, UserHeard(0, "Summarize."), ReplyWords(0, "Short.", 0), ReplyOver(0))
    kinds = [e["type"] for e in events]
    assert "conversation.item.added" not in kinds and "conversation.item.done" not in kinds
    assert "response.output_item.added" in kinds
    done = events[-1]["response"]
    assert done["metadata"] == {"topic": "summary"} and done["conversation_id"] is None
    assert t.items.get(events[1]["item"]["id"]) is None


def test_transcription_null_leaves_the_user_item_without_transcript():
    t = translator(transcription=False)
    events = run(t, UserStarted(0), UserStopped(0, 1.0), UserHeard(0, "Hello."))
    kinds = [e["type"] for e in events]
    assert not [kind for kind in kinds if "transcription" in kind]
    assert events[kinds.index("conversation.item.done")]["item"]["content"][0]["transcript"] is None


def test_a_manual_commit_announces_the_turn_once():
    t = translator()
    events = run(t, Committed(4), UserStopped(4, 2.0))
    assert [e["type"] for e in events] == ["input_audio_buffer.committed", "conversation.item.added"]


def test_heard_text_follows_each_pieces_audio():
    response = Response(0)
    response.chunks = {0: "One two three four.", 1: "Five six."}
    response.chunk_audio = {0: 2.0, 1: 1.0}
    assert response.heard(0.0) == ""
    assert response.heard(1.0) == "One two"
    assert response.heard(2.5) == "One two three four. Five"
    assert response.heard(10.0) == "One two three four. Five six."
    response.chunks[2] = "Never voiced."  # no audio of it was sent
    assert response.heard(10.0) == "One two three four. Five six."


def test_a_turn_plan_holds_for_that_turn_only():
    llm = EchoLM()
    llm.history_turns = 2
    llm.system_prompt = "Be kind."
    llm.context.plan_turn(1, instructions="Answer in French.", remember=False)
    assert llm.chat_messages("Hi", KEEP)[0] == {"role": "system", "content": "Be kind."}
    said = [m.text for m in llm.process(Transcript("Bonjour", 1)) if hasattr(m, "text")]
    assert said == ["Bonjour"] and llm.context.history() == []  # out of band: not remembered
    list(llm.process(Transcript("Hello", 2)))
    assert llm.context.history() == [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hello"}]


def test_cancelling_an_out_of_band_reply_leaves_the_history_alone():
    t = translator()
    t.typed_turns.add(0)
    t.requests[0] = ResponseRequest(out_of_band=True)
    run(t, UserHeard(0, "Summarize."), ReplyWords(0, "Short.", 0), CancelReply(0, "client_cancelled"))
    assert t.chat.history() == []


class StubVAD:
    """A VAD whose utterances are scripted: each chunk's samples say what it emits (1: speech, 0: silence)."""

    accepts, emits, takes = (), (), ()

    def __init__(self):
        self.turn, self.open = 0, False

    def process(self, message):
        from s2s.messages import SpeechStarted

        for value in message.samples:
            if value and not self.open:
                self.open = True
                yield SpeechStarted(self.turn)
            elif not value and self.open:
                yield from self.flush()

    def flush(self):
        from s2s.messages import SpeechSegment

        if self.open:
            self.open = False
            yield SpeechSegment(np.zeros(160, np.float32), 16000, self.turn, 0.0, 1.0)
            self.turn += 1


def test_the_session_vad_commits_and_clears_the_utterance_in_progress():
    from s2s.messages import AudioChunk, SpeechSegment, SpeechStarted
    from s2s.server.stages import SessionVAD, TurnCounter

    vad = SessionVAD(StubVAD(), TurnCounter())
    chunk = lambda *values: AudioChunk(np.array(values, np.float32), 16000)  # noqa: E731
    assert not vad.request("commit")  # nothing in progress
    assert [type(m) for m in vad.process(chunk(1))] == [SpeechStarted]
    assert vad.request("commit")
    out = list(vad.process(chunk()))  # the commit acts before the next chunk, even an empty one
    assert [type(m) for m in out] == [SpeechSegment] and out[0].turn == 0
    list(vad.process(chunk(1)))
    assert vad.request("clear")
    assert list(vad.process(chunk(0))) == []  # the cleared utterance never becomes a turn
    out = list(vad.process(chunk(1, 0)))
    assert [type(m) for m in out] == [SpeechStarted, SpeechSegment]


def test_response_done_carries_the_tokens_of_its_rounds_as_the_realtime_api_shapes_them(schema):
    from s2s.usage import Usage

    t = translator()
    run(t, UserStarted(0), UserStopped(0, 1.0), UserHeard(0, "Hi?"))
    counts = [Usage(input_tokens=30), Usage(output_tokens=5), Usage(cached_tokens=12),  # one count per metric
              Usage(input_tokens=40), Usage(output_tokens=7)]  # a second round (a tool's result) adds to it
    events = run(t, ReplyWords(0, "Hello.", 0), *(TokensUsed(0, usage) for usage in counts), ReplyOver(0))
    done = events[-1]
    schema.validate_python(done)
    assert done["type"] == "response.done" and done["response"]["usage"] == {
        "total_tokens": 82, "input_tokens": 70, "output_tokens": 12,
        "input_token_details": {"text_tokens": 70, "audio_tokens": 0, "image_tokens": 0, "cached_tokens": 12,
                                "cached_tokens_details": {"text_tokens": 12, "audio_tokens": 0, "image_tokens": 0}},
        "output_token_details": {"text_tokens": 12, "audio_tokens": 0}}
    # tokens counted after the response is done (or for a turn without one) go to no response
    assert run(t, TokensUsed(0, Usage(input_tokens=3)), TokensUsed(9, Usage(input_tokens=3))) == []
    run(t, UserStarted(1), UserStopped(1, 2.0), UserHeard(1, "And?"))
    [echoed] = run(t, ReplyWords(1, "And?", 0), ReplyOver(1))[-1:]
    assert "usage" not in echoed["response"]  # an LLM that counts nothing (llm=echo): no usage, as before

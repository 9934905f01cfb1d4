"""A turn cut off at a mid-sentence pause, resumed when the speaker goes on (``vad.resume_ms``), as a client sees it.

Through the openai SDK on the shared llm=echo server (tests/conftest.py ``echo_server``), paced as a microphone
would be: the echo repeats what it heard, so the last reply says which words the turn that stood held.
"""
from __future__ import annotations

import numpy as np
import pytest

from realtime_server import API_KEY, RATE, Events, openai_client, send_speech
from s2s import audio

pytest.importorskip("websockets")
pytest.importorskip("openai")

COMPLETED = "conversation.item.input_audio_transcription.completed"


def test_going_on_after_a_cut_pause_deletes_the_cut_turn_and_the_whole_sentence_is_answered(echo_server, espeak,
                                                                                            tmp_path):
    first, second = (audio.read_audio(espeak(text, tmp_path / f"{index}.wav"), RATE)
                     for index, text in enumerate(["Please tell me a long story about", "a small brown dog."]))
    # 1.2 s inside the sentence: the session's 500 ms ends the turn in it, the speaker goes on 0.7 s later
    speech = audio.float_to_int16(np.concatenate([first, audio.silence(1.2, RATE), second, audio.silence(2.0, RATE)]))
    echo_server.wait_idle()
    with openai_client(echo_server, API_KEY).realtime.connect(model="s2s-test") as connection:
        events = Events(connection)
        events.until("session.created", 30)
        connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
            "type": "server_vad", "silence_duration_ms": 500}}}})
        events.until("session.updated", 30)
        send_speech(connection, speech, paced=True)
        while len(events.of(COMPLETED)) < 2:
            events.until(COMPLETED, 120)
        whole = events.of(COMPLETED)[1]
        done = events.until("response.done", 120, where=lambda event: event.response.status == "completed"
                            and events.all.index(event) > events.all.index(whole))
    heard = events.of(COMPLETED)
    assert len(events.of("input_audio_buffer.speech_started")) == 2
    assert "story" in heard[0].transcript.lower() and "dog" not in heard[0].transcript.lower()
    # the turn that stood holds the whole sentence, and its reply (the echo) says it
    assert {"story", "dog"} <= set(whole.transcript.lower().replace(".", " ").split())
    said = events.of("response.output_audio_transcript.done")[-1]
    assert said.response_id == done.response.id and "dog" in said.transcript.lower()
    # the cut turn's question and its reply's item were deleted, before the whole one was added
    cut = [e.item.id for e in events.of("conversation.item.added")][:2]
    deleted = events.of("conversation.item.deleted")
    assert heard[0].item_id in cut and {e.item_id for e in deleted} == set(cut) and len(deleted) == 2
    kinds = [e.type for e in events.all]
    assert kinds.index("conversation.item.deleted") < events.all.index(whole)

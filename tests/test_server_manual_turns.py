"""Manual turns (turn_detection null), the input buffer's commit and clear, and an out-of-band response.

Through the openai SDK on the shared llm=echo server (tests/conftest.py ``echo_server``).
"""
from __future__ import annotations

import pytest

from realtime_server import API_KEY, Events, openai_client, pcm16, reply_audio, send_speech

pytest.importorskip("websockets")
pytest.importorskip("openai")


def connect(server):
    server.wait_idle()
    return openai_client(server, API_KEY).realtime.connect(model="s2s-test")


def test_with_turn_detection_null_the_client_commits_each_turn(echo_server, espeak, tmp_path):
    speech = pcm16(espeak("The quick brown fox jumps over the lazy dog.", tmp_path / "fox.wav"))
    with connect(echo_server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        assert events.until("session.updated", 30).session.audio.input.turn_detection is None
        connection.input_audio_buffer.commit()
        assert events.until("error", 30).error.code == "input_audio_buffer_commit_empty"
        send_speech(connection, speech[:24000])
        connection.input_audio_buffer.clear()
        events.until("input_audio_buffer.cleared", 30)
        send_speech(connection, speech)
        connection.input_audio_buffer.commit()
        committed = events.until("input_audio_buffer.committed", 30)
        heard = events.until("conversation.item.input_audio_transcription.completed", 120)
        assert heard.item_id == committed.item_id and "quick" in heard.transcript.lower()
        assert heard.transcript.lower().count("quick") == 1  # the cleared audio is not in the turn
        done = events.until("response.done", 120)
        assert done.response.status == "completed" and len(reply_audio(events.all, done.response.id)) > 12000
        assert not events.of("input_audio_buffer.speech_started")  # no VAD ended or began this turn


def test_an_out_of_band_response_stays_out_of_the_history(echo_server):
    with connect(echo_server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        connection.response.create(response={"conversation": "none", "instructions": "Summarize.",
                                             "metadata": {"purpose": "summary"}, "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Side note."}]}]})
        done = events.until("response.done", 120)
        assert done.response.status == "completed" and done.response.metadata == {"purpose": "summary"}
        assert done.response.conversation_id is None
        assert not events.of("conversation.item.added")
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "In band."}]})
        connection.response.create()
        events.until("response.done", 120)
        _, sessions = echo_server.get("/v1/sessions")
        active = [s for s in sessions["sessions"] if s["status"] == "active"][0]
        assert [m["content"] for m in active["history"]] == ["In band.", "In band."]

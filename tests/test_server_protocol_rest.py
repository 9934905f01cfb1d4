"""The rest of the Realtime protocol through a real server session: the transcription language, a response's
own voice and token cap, a failed transcription, and idle_timeout_ms.

One server for the module (``stt=openai`` and ``tts=openai`` against the FastAPI app of
tests/fixtures/openai_servers.py, which this process runs and which records what each request asked: the
language a transcription was asked in, the voice a reply was spoken in; ``llm=echo``), on 127.0.0.1.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from realtime_server import API_KEY, Events, RunningServer, openai_client, pcm16, send_speech
from tests.fixtures import openai_servers

pytest.importorskip("websockets")
pytest.importorskip("openai")
pytest.importorskip("fastapi")

HEARD = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def root():
    with openai_servers.faulty_server() as url:
        yield url


@pytest.fixture(scope="module")
def server(root, tmp_path_factory):
    api = f"{root}/record/v1"
    running = RunningServer(tmp_path_factory.mktemp("server"), "stt=openai", f"stt.base_url={api}", "stt.model=m",
                            "stt.language=en", "llm=echo", "tts=openai", f"tts.base_url={api}", "tts.model=m",
                            "tts.voice=alloy", "turn=silence", "server.max_sessions=1", "server.log_transcripts=true",
                            env={"S2S_API_KEY": API_KEY})
    yield running
    assert running.stop() == 0, running.output[-3000:]


@pytest.fixture(scope="module")
def speech(espeak, tmp_path_factory):
    return pcm16(espeak("The quick brown fox jumps over the lazy dog, and then it runs far away.",
                        tmp_path_factory.mktemp("speech") / "fox.wav"))


def connect(server):
    server.wait_idle()
    return openai_client(server, API_KEY).realtime.connect(model="s2s-test")


@contextmanager
def microphone(connection, chunk_s=0.1, most_s=60):
    """Silence appended in real time from a thread, as a client's open microphone, until the block ends."""
    stop = threading.Event()

    def stream():
        for _ in range(int(most_s / chunk_s)):
            if stop.wait(chunk_s):
                return
            send_speech(connection, np.zeros(int(24000 * chunk_s), np.int16))

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def say(connection, events, text, **response):
    connection.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": text}]})
    connection.response.create(**({"response": response} if response else {}))
    created = events.until("response.created", 60)
    return events.until("response.done", 120, lambda e: e.response.id == created.response.id)


def transcript(done) -> str:
    return done.response.output[0].content[0].transcript


def test_the_sessions_transcription_language_reaches_the_stt_for_its_turns_only(server, speech):
    with connect(server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        connection.session.update(session={"type": "realtime", "audio": {"input": {"transcription": {
            "model": "gpt-4o-mini-transcribe", "language": "xx"}}}})
        error = events.until("error", 30).error
        assert error.param == "session.audio.input.transcription.language"
        assert "language=xx is not accepted" in error.message
        connection.session.update(session={"type": "realtime", "audio": {"input": {"transcription": {
            "model": "gpt-4o-mini-transcribe", "language": "fr"}}}})
        assert events.until("session.updated", 30).session.audio.input.transcription.language == "fr"
        openai_servers.HEARD.clear()
        send_speech(connection, speech)
        assert events.until(HEARD, 120).transcript == openai_servers.HEARD_TEXT
        assert events.until("response.done", 120).response.status == "completed"
        asked = [request["language"] for request in openai_servers.HEARD]
        assert asked and set(asked) == {"fr"}, asked  # the turn's own pass and any partial one
    with connect(server) as connection:  # the next session borrows the same pooled STT
        events = Events(connection)
        assert events.until("session.created", 30).session.audio.input.transcription.language == "en"
        openai_servers.HEARD.clear()
        send_speech(connection, speech)
        events.until(HEARD, 120)
        assert {request["language"] for request in openai_servers.HEARD} == {"en"}


def test_a_failed_transcription_has_its_event_and_the_session_goes_on(server, speech):
    with connect(server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        openai_servers.FAIL_TRANSCRIPTIONS[0] = 100  # the turn's own and any partial pass fail
        try:
            send_speech(connection, speech)
            committed = events.until("input_audio_buffer.committed", 120)
            failed = events.until("conversation.item.input_audio_transcription.failed", 120)
        finally:
            openai_servers.FAIL_TRANSCRIPTIONS[0] = 0
        assert failed.item_id == committed.item_id and failed.content_index == 0
        assert failed.error.code == "transcription_failed" and "http" not in failed.error.message  # no internals
        done = events.until("conversation.item.done", 30, lambda e: e.item.id == committed.item_id)
        assert done.item.status == "completed" and done.item.content[0].transcript is None
        send_speech(connection, speech)  # the next turn is heard and answered
        assert events.until(HEARD, 120).transcript == openai_servers.HEARD_TEXT
        assert events.until("response.done", 120).response.status == "completed"
        assert len(events.of("response.created")) == 1, "the failed turn got no response"
        assert not events.of("error")


def test_a_response_speaks_in_its_own_voice_and_the_next_in_the_sessions(server):
    with connect(server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        openai_servers.SPOKEN.clear()
        own = say(connection, events, "Hello there.", audio={"output": {"voice": "verse"}})
        assert own.response.status == "completed"
        assert {body["voice"] for body in openai_servers.SPOKEN} == {"verse"}
        openai_servers.SPOKEN.clear()
        assert say(connection, events, "Good morning.").response.status == "completed"
        assert {body["voice"] for body in openai_servers.SPOKEN} == {"alloy"}  # the session's again
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Louder."}]})
        connection.response.create(response={"audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}})
        error = events.until("error", 30).error
        assert error.param == "response.audio.output.format" and "one output format per session" in error.message


def test_max_output_tokens_caps_every_reply_of_the_session_and_one_response(server):
    asked = "Hello there, how are you doing today?"
    with connect(server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        connection.session.update(session={"type": "realtime", "max_output_tokens": 2})
        assert events.until("session.updated", 30).session.max_output_tokens == 2
        capped = transcript(say(connection, events, asked))
        assert capped.split() == ["Hello"], capped  # the echo keeps what 2 tokens (about 8 characters) hold
        assert transcript(say(connection, events, asked, max_output_tokens="inf")) == asked  # the LLM's own cap
        four = transcript(say(connection, events, asked, max_output_tokens=4))
        assert len(four.split()) == 3, four
        connection.session.update(session={"type": "realtime", "max_output_tokens": "inf"})
        assert events.until("session.updated", 30).session.max_output_tokens == "inf"
        assert transcript(say(connection, events, asked)) == asked


def test_idle_timeout_prompts_a_silent_user_after_the_reply_and_speech_holds_it_off(server, speech):
    with connect(server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
            "type": "server_vad", "idle_timeout_ms": 1500}}}})
        assert events.until("session.updated", 30).session.audio.input.turn_detection.idle_timeout_ms == 1500
        first = say(connection, events, "Hello there.")
        finished = time.monotonic()
        with microphone(connection):  # a client streams its (silent) microphone all along
            timeout = events.until("input_audio_buffer.timeout_triggered", 30)
        waited = time.monotonic() - finished
        assert 1.4 < waited < 15, waited  # after the reply's audio (a second or so) plus 1.5 s
        assert timeout.audio_end_ms - timeout.audio_start_ms == 1500 and timeout.audio_start_ms > 0
        committed = events.until("input_audio_buffer.committed", 10)
        assert committed.item_id == timeout.item_id
        assert events.until(HEARD, 30).transcript == ""  # silence has no words
        prompt = events.until("response.done", 60, lambda e: e.response.id != first.response.id)
        assert prompt.response.status == "completed" and "said nothing for 1.5 seconds" in transcript(prompt)

        send_speech(connection, speech)  # the user speaks: no prompt until after the reply to that
        started = events.until("input_audio_buffer.speech_started", 60)
        answered = events.until("response.done", 120, lambda e: e.response.id != prompt.response.id)
        assert answered.response.status == "completed"
        between = events.all[events.all.index(started):events.all.index(answered)]
        assert not [e for e in between if e.type == "input_audio_buffer.timeout_triggered"]
        assert events.until("input_audio_buffer.timeout_triggered", 30).item_id != timeout.item_id  # again


def test_over_websocket_a_cancelled_reply_ends_with_response_done_and_no_output_buffer_event(server):
    """output_audio_buffer.* is WebRTC's (the server plays the audio there); a WebSocket client owns playback."""
    # llm=echo says it back: five sentences, each its own speech request, so the cancel lands before the last
    # (one sentence could be spoken whole before the cancel arrived, and the reply completed)
    long = ("Please tell me a long story about a small brown dog. It lives under a tall green tree. The tree stands "
            "beside a quiet old house. A river runs past the house to the sea. The dog swims in it every morning.")
    with connect(server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": long}]})
        connection.response.create()
        created = events.until("response.created", 60)
        events.until("response.output_audio.delta", 60)
        connection.response.cancel()
        done = events.until("response.done", 60, lambda e: e.response.id == created.response.id)
        assert done.response.status == "cancelled"
        connection.session.update(session={"type": "realtime"})  # whatever was on its way has arrived after this
        events.until("session.updated", 30)
        assert not [e for e in events.all if e.type.startswith("output_audio_buffer.")]

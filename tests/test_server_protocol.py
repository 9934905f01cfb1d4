"""The realtime server's protocol through the official openai SDK: keys, session limit, bad input, barge-in, cancel.

One real server (``llm=echo``: the LLM does not matter here) for the whole module, on 127.0.0.1.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import soundfile

from realtime_server import (API_KEY, ROOT, Events, RunningServer, open_websocket, openai_client, pcm16,
                             reply_audio, send_speech)

pytest.importorskip("websockets")
pytest.importorskip("openai")

LONG = ("Please tell me a long story about a small brown dog, a tall green tree, a quiet old house, "
        "and a river that runs far away to the sea.")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("server")
    # kokoro_onnx: a TTS with named voices, so session.update's voice is exercised
    running = RunningServer(run_dir, "llm=echo", "tts=kokoro_onnx", "server.max_sessions=2",
                            "server.max_frame_bytes=65536",
                            env={"S2S_API_KEY": API_KEY})
    yield running
    code = running.stop()
    assert code == 0, running.output[-3000:]


@pytest.fixture(scope="module")
def speech(tmp_path_factory, espeak):
    folder = tmp_path_factory.mktemp("speech")
    return {"short": espeak("The quick brown fox jumps over the lazy dog.", folder / "short.wav"),
            "long": espeak(LONG, folder / "long.wav")}


def connect(server, api_key=API_KEY):
    return openai_client(server, api_key).realtime.connect(model="s2s-test")


def test_session_starts_with_its_effective_configuration(server):
    with connect(server) as connection:
        events = Events(connection)
        created = events.until("session.created", 30)
        assert created.session.audio.input.format.rate == 24000
        connection.session.update(session={"type": "realtime", "instructions": "Be brief.", "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": 16000},
                      "turn_detection": {"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 500}},
            "output": {"format": {"type": "audio/pcm", "rate": 22050}, "voice": "jf_nezumi"}}})
        updated = events.until("session.updated", 30)
        assert updated.session.instructions == "Be brief."
        assert updated.session.audio.input.format.rate == 16000 and updated.session.audio.output.format.rate == 22050
        assert updated.session.audio.output.voice == "jf_nezumi"
        assert updated.session.audio.input.turn_detection.threshold == 0.6
        assert updated.session.audio.input.turn_detection.silence_duration_ms == 500


def test_a_missing_or_wrong_api_key_is_refused(server):
    from websockets.exceptions import InvalidStatus

    for key in ("wrong-key-000000000", ""):
        with pytest.raises(InvalidStatus) as refused:
            with openai_client(server, key or "x").realtime.connect(model="m", extra_headers={
                    "Authorization": f"Bearer {key}"} if key else {"Authorization": ""}):
                pass
        assert refused.value.response.status_code == 401
    assert server.get("/v1/sessions", api_key="wrong-key-000000000")[0] == 401
    assert server.get("/health", api_key=None) == (200, {"status": "ok"})


def test_a_page_of_another_site_is_refused_and_the_servers_own_page_is_not(server):
    """A browser tab on any site could reach a server on localhost: only the server's own origin may connect."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect as ws_connect

    headers = {"Authorization": f"Bearer {API_KEY}"}
    with pytest.raises(InvalidStatus) as refused:
        with ws_connect(server.url, origin="http://evil.example", additional_headers=headers, open_timeout=10):
            pass
    assert refused.value.response.status_code == 403 and b"origin_not_allowed" in refused.value.response.body
    with ws_connect(server.url, origin=server.http, additional_headers=headers, open_timeout=10) as socket:
        assert json.loads(socket.recv(timeout=30))["type"] == "session.created"


def test_one_session_over_the_limit_is_refused_and_the_others_go_on(server):
    with connect(server) as first, connect(server) as second:
        held = [Events(first), Events(second)]
        for events in held:
            events.until("session.created", 30)
        with connect(server) as third:
            refused = Events(third)
            error = refused.until("error", 30)
            assert error.error.code == "session_limit_reached"
            assert refused.closed.wait(10), "the refused connection was closed"
        for connection, events in zip((first, second), held):
            connection.session.update(session={"type": "realtime", "instructions": "Still here."})
            assert events.until("session.updated", 30).session.instructions == "Still here."
    _, sessions = server.get("/v1/sessions")
    assert sessions["refused"] >= 1


BAD_INPUT = {
    "invalid JSON": ("{not json", "invalid_json"),
    "not an object": ("[1, 2]", "invalid_event"),
    "unknown event type": (json.dumps({"type": "input_audio_buffer.explode"}), "unknown_event_type"),
    "missing type": (json.dumps({"audio": "AAAA"}), "missing_required_parameter"),
    "missing field": (json.dumps({"type": "input_audio_buffer.append"}), "missing_required_parameter"),
    "audio not base64": (json.dumps({"type": "input_audio_buffer.append", "audio": "not base64 !!"}), "invalid_audio"),
    "odd PCM16 length": (json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}),
                         "invalid_audio"),
    "frame over the limit": (json.dumps({"type": "input_audio_buffer.append",
                                         "audio": base64.b64encode(bytes(70000)).decode()}), "frame_too_large"),
    "rate out of range": (json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
        "input": {"format": {"type": "audio/pcm", "rate": 1000}}}}}), "invalid_value"),
    "a config key": (json.dumps({"type": "session.update", "session": {"llm": {"_target_": "os.system"}}}),
                     "unknown_parameter"),
    "a _target_": (json.dumps({"type": "session.update", "session": {"audio": {"output": {
        "_target_": "os.system"}}}}), "unknown_parameter"),
    "a voice the TTS lacks": (json.dumps({"type": "session.update", "session": {"audio": {"output": {
        "voice": "no_such_voice"}}}}), "invalid_value"),
    "threshold out of range": (json.dumps({"type": "session.update", "session": {"audio": {"input": {
        "turn_detection": {"type": "server_vad", "threshold": 3}}}}}), "invalid_value"),
    "an eagerness it lacks": (json.dumps({"type": "session.update", "session": {"audio": {"input": {
        "turn_detection": {"type": "semantic_vad", "eagerness": "wild"}}}}}), "invalid_value"),
    "wrong field type": (json.dumps({"type": "session.update", "session": {"instructions": 42}}), "invalid_type"),
    "unknown item type": (json.dumps({"type": "conversation.item.create", "item": {"type": "image"}}),
                          "invalid_value"),
    "tool output for no call": (json.dumps({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": "call_nope", "output": "{}"}}), "invalid_value"),
    "response with nothing to say": (json.dumps({"type": "response.create"}), "invalid_request"),
    "cancel with no response": (json.dumps({"type": "response.cancel"}), "response_cancel_not_active"),
}


def test_every_bad_input_gets_an_error_event_and_the_session_stays_usable(server):
    with connect(server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        for name, (frame, code) in BAD_INPUT.items():
            connection.send_raw(frame)
            error = events.until("error", 30)
            assert error.error.code == code, (name, error.error)
            assert error.error.message, name
        # nothing above was applied, and the session still answers
        connection.session.update(session={"type": "realtime", "instructions": "Fine."})
        updated = events.until("session.updated", 30)
        assert updated.session.instructions == "Fine." and updated.session.audio.input.format.rate == 24000
        assert updated.session.audio.output.voice == "jf_alpha"
    assert server.alive()


def test_a_typed_turn_gets_a_spoken_reply_and_can_be_cancelled(server):
    with connect(server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hello there."}]})
        events.until("conversation.item.created", 30)
        connection.response.create()
        created = events.until("response.created", 60)
        done = events.until("response.done", 120)
        assert done.response.id == created.response.id and done.response.status == "completed"
        assert "Hello there" in events.of("response.output_audio_transcript.done")[-1].transcript
        assert len(reply_audio(events.all, done.response.id)) > 0.3 * 24000
        assert not events.of("conversation.item.input_audio_transcription.completed"), "typed, not heard"

        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": LONG}]})
        connection.response.create()
        second = events.until("response.created", 60)
        connection.response.create()  # one at a time
        assert events.until("error", 30).error.code == "conversation_already_has_active_response"
        connection.response.cancel()
        cancelled = events.until("response.done", 60, lambda e: e.response.id == second.response.id)
        assert cancelled.response.status == "cancelled"
        assert cancelled.response.status_details.reason == "client_cancelled"
        time.sleep(2.0)  # whatever was still on its way for it
        connection.session.update(session={"type": "realtime"})
        events.until("session.updated", 30)
        after = events.all[events.all.index(cancelled) + 1:]
        assert not [e for e in after if e.type == "response.output_audio.delta" and e.response_id == second.response.id]


def test_a_voice_and_speed_change_the_pooled_tts_in_place_and_the_reply_comes(server):
    with connect(server) as connection:
        events = Events(connection)
        session_id = events.until("session.created", 30).session.id
        connection.session.update(session={"type": "realtime", "audio": {"output": {"voice": "jm_kumo",
                                                                                    "speed": 1.2}}})
        assert events.until("session.updated", 30).session.audio.output.voice == "jm_kumo"
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hello there."}]})
        connection.response.create()
        done = events.until("response.done", 120)
        assert done.response.status == "completed" and len(reply_audio(events.all, done.response.id)) > 0.3 * 24000
        [shown] = [s for s in server.get("/v1/sessions")[1]["sessions"] if s["id"] == session_id]
        assert shown["tts"] == "pooled"  # no second KokoroOnnxTTS was built and set up for this session
    assert f"session {session_id}: tts changed in place (voice=jm_kumo, speed=1.2)" in server.output
    assert f"session {session_id}: building its own" not in server.output


def test_barge_in_cancels_the_reply_and_the_new_turn_is_answered(server, speech):
    with connect(server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        send_speech(connection, pcm16(speech["long"]))
        heard = events.until("conversation.item.input_audio_transcription.completed", 120)
        assert "dog" in heard.transcript.lower()
        first = events.until("response.created", 60)
        events.until("response.output_audio.delta", 120)
        send_speech(connection, pcm16(speech["short"]))  # the user talks over the reply
        events.until("input_audio_buffer.speech_started", 60)
        done = events.until("response.done", 60, lambda e: e.response.id == first.response.id)
        assert done.response.status == "cancelled" and done.response.status_details.reason == "turn_detected"
        after = events.all[events.all.index(done) + 1:]
        second_heard = events.until("conversation.item.input_audio_transcription.completed", 120)
        assert "quick" in second_heard.transcript.lower()
        second = events.until("response.done", 120)
        assert second.response.status == "completed" and second.response.id != first.response.id
        after = events.all[events.all.index(done) + 1:]
        assert not [e for e in after if e.type == "response.output_audio.delta" and e.response_id == first.response.id]
        assert done.response.output[0].content[0].transcript, "what was already said stays with the reply"


def test_a_client_that_vanishes_mid_reply_frees_its_session(server, speech):
    socket = open_websocket(server.url + "?model=m", additional_headers={"Authorization": f"Bearer {API_KEY}"},
                         max_size=None)
    samples = pcm16(speech["long"])
    for start in range(0, len(samples), 2400):
        socket.send(json.dumps({"type": "input_audio_buffer.append",
                                "audio": base64.b64encode(samples[start:start + 2400].tobytes()).decode()}))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if json.loads(socket.recv(timeout=120))["type"] == "response.output_audio.delta":
            break
    socket.close_socket()  # gone without a close frame
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server.get("/v1/sessions")[1]["active"]:
        time.sleep(0.2)
    _, sessions = server.get("/v1/sessions")
    assert sessions["active"] == 0
    assert sessions["sessions"][-1]["status"] in ("disconnected", "closed")
    with connect(server) as first, connect(server) as second:  # both pipelines are free again
        for connection in (first, second):
            assert Events(connection).until("session.created", 30).type == "session.created"


def test_the_file_client_speaks_a_question_and_writes_the_reply(server, speech, tmp_path):
    for rate in (24000, 16000):  # 16 kHz: PCM16 both ways at the rate the client names
        out = tmp_path / f"reply-{rate}.wav"
        result = subprocess.run([sys.executable, "-m", "s2s.client", "--url", server.url, "--api-key", API_KEY,
                                 "--file", str(speech["short"]), "--out", str(out), "--rate", str(rate)], cwd=ROOT,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "you:" in result.stdout and "assistant:" in result.stdout and "quick" in result.stdout.lower()
        data, written_rate = soundfile.read(out)
        assert written_rate == rate and len(data) > rate
    refused = subprocess.run([sys.executable, "-m", "s2s.client", "--url", server.url, "--api-key", "wrong-key-00",
                              "--file", str(speech["short"])], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "401" in refused.stderr


def test_sessions_and_their_turns_are_available_as_json(server):
    status, document = server.get("/v1/sessions")
    assert status == 200 and document["max_sessions"] == 2
    answered = [s for s in document["sessions"] if s["summary"]["turns"]]
    assert answered, document
    turn = answered[0]["turns"][0]
    assert {"voice_to_voice_s", "stt_s", "tts_first_audio_s", "tts_rtf"} <= set(turn["timings"])
    metrics = json.loads(open(answered[0]["metrics_path"]).read())
    assert metrics["summary"]["turns"] == answered[0]["summary"]["turns"]


def test_the_server_bench_command_runs_a_bounded_load(server):
    result = subprocess.run([sys.executable, "-m", "s2s.bench", "server", "--url", server.url, "--api-key", API_KEY,
                             "--sessions", "1", "--seconds", "5"], cwd=ROOT, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sessions held" in result.stdout and "replies completed" in result.stdout and "p90" in result.stdout


def test_the_server_bench_compares_webrtc_with_websocket_in_one_run(server):
    pytest.importorskip("aiortc", reason="the webrtc extra (aiortc) is needed for WebRTC calls")
    server.wait_idle()
    result = subprocess.run([sys.executable, "-m", "s2s.bench", "server", "--url", server.url, "--api-key", API_KEY,
                             "--transport", "both", "--seconds", "3"], cwd=ROOT, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split(":")[0].strip(): line for line in result.stdout.splitlines() if ": p50" in line}
    assert set(lines) == {"websocket", "webrtc"} and "over 1 turns" in lines["webrtc"], result.stdout


ALSA = "/usr/share/alsa/alsa.conf"
needs_alsa = pytest.mark.skipif(not os.path.exists(ALSA), reason="needs ALSA (Linux with libasound2)")


def alsa_env(conf: str) -> dict[str, str]:
    return {**os.environ, "ALSA_CONFIG_PATH": f"{ALSA}:{ROOT / 'tests' / 'data' / conf}"}


@needs_alsa
def test_no_device_errors_of_the_live_client_are_one_clear_line():
    result = subprocess.run([sys.executable, "-m", "s2s.client", "--url", "ws://127.0.0.1:9/v1/realtime"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60, env=alsa_env("asound_nodevice.conf"))
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and "--file" in result.stderr and "Traceback" not in result.stderr


@needs_alsa
def test_the_live_client_streams_the_microphone_until_ctrl_c(server):
    """Under ALSA's null device the samples are garbage: this checks the flow, never content or timing."""
    process = subprocess.Popen([sys.executable, "-m", "s2s.client", "--url", server.url, "--api-key", API_KEY],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=alsa_env("asound_null.conf"),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert "listening" in process.stdout.readline()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not server.get("/v1/sessions")[1]["active"]:
            time.sleep(0.2)
        assert server.get("/v1/sessions")[1]["active"] == 1
        time.sleep(1.0)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 130, process.stdout.read()
    finally:
        process.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and server.get("/v1/sessions")[1]["active"]:
        time.sleep(0.2)
    assert server.get("/v1/sessions")[1]["active"] == 0


def test_dry_run_prints_the_graph_each_session_gets_with_overrides_applied(tmp_path):
    from conftest import run_cli

    result = run_cli("server=realtime", "llm=echo", "tts=kokoro_onnx", "tts.voice=jf_nezumi", "dry_run=true",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for part in ("SocketSource", "SileroVAD", "FasterWhisperSTT", "EchoLM", "KokoroOnnxTTS", "voice=jf_nezumi",
                 "SocketSink", "ws://127.0.0.1:8765/v1/realtime"):
        assert part in result.stdout, (part, result.stdout)


def test_bad_server_settings_and_impossible_profiles_are_config_errors(tmp_path):
    from conftest import run_cli

    result = run_cli("server=realtime", "server.port=70000", "server.max_sessions=0", "dry_run=true", cwd=tmp_path)
    assert result.returncode == 2
    assert "server.port=70000: invalid" in result.stderr and "server.max_sessions=0: invalid" in result.stderr
    refused = run_cli("server=realtime", "profile=cuda_server", "platform=linux", "dry_run=true", cwd=tmp_path)
    assert refused.returncode == 2 and "cuda" in refused.stderr  # platform rules apply to the server as well


def test_a_cancelled_reply_keeps_what_was_said_in_the_llm_history():
    from s2s.llm.echo import EchoLM
    from s2s.messages import ReplyText, Transcript

    asked = "Tell me a story. It has a dog. And a tree."
    llm = EchoLM(first_chunk_words=0)
    llm.history_turns = 2
    replies = llm.process(Transcript(asked, 0))
    first = next(message for message in replies if isinstance(message, ReplyText))
    next(replies)  # the runner took the first sentence and asked for more
    replies.close()  # what the runner does to a cancelled turn's LLM
    assert first.text == "Tell me a story."
    assert llm.chat_messages("And then?") == [{"role": "user", "content": asked},
                                              {"role": "assistant", "content": "Tell me a story."},
                                              {"role": "user", "content": "And then?"}]
    finished = EchoLM()
    finished.history_turns = 2
    list(finished.process(Transcript(asked, 0)))  # the LLM was done; only the TTS and sink were behind
    finished.context.remember(0, asked, "Tell me a story. It has a dog.")  # what the session's client heard
    said = {"role": "assistant", "content": "Tell me a story. It has a dog."}
    assert finished.chat_messages("And then?") == [{"role": "user", "content": asked}, said,
                                                   {"role": "user", "content": "And then?"}]


def test_pipelines_share_whisper_weights_and_transcribe_at_the_same_time(espeak, tmp_path):
    from s2s import audio as pipeline_audio
    from s2s import sharing
    from s2s.messages import SpeechSegment, Transcript
    from s2s.stt.faster_whisper import FasterWhisperSTT

    samples = pipeline_audio.read_audio(espeak("The quick brown fox.", tmp_path / "fox.wav"), 16000)
    segment = SpeechSegment(samples, 16000, 0, 0.0, len(samples) / 16000)
    sharing.enable()
    try:
        stages = [FasterWhisperSTT(device="cpu"), FasterWhisperSTT(device="cpu")]
        for stage in stages:
            stage.setup()
        assert sharing.shared_count() == 1  # one model for both pipelines
        heard: list[str] = []

        def transcribe(stage):
            heard.extend(m.text for m in stage.process(segment) if isinstance(m, Transcript))

        threads = [threading.Thread(target=transcribe, args=(stage,)) for stage in stages]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert len(heard) == 2 and all("quick" in text.lower() for text in heard), heard
    finally:
        sharing.enable(False)


def test_turn_detection_changes_mid_session_and_the_voice_only_before_audio(server, speech):
    with connect(server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        send_speech(connection, pcm16(speech["short"])[:2400])  # the graph runs from the first audio on
        connection.session.update(session={"type": "realtime", "audio": {"output": {"voice": "jm_kumo"}}})
        assert events.until("error", 30).error.code == "cannot_update_voice"
        connection.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
            "type": "server_vad", "threshold": 0.4, "silence_duration_ms": 500, "prefix_padding_ms": 200}}}})
        detection = events.until("session.updated", 30).session.audio.input.turn_detection
        assert (detection.threshold, detection.silence_duration_ms, detection.prefix_padding_ms) == (0.4, 500, 200)
        send_speech(connection, pcm16(speech["short"]))  # heard by the new VAD
        heard = events.until("conversation.item.input_audio_transcription.completed", 120)
        assert "quick" in heard.transcript.lower()
        assert events.until("response.done", 120).response.status == "completed"


def test_system_and_assistant_messages_a_client_adds_join_the_history_and_leave_it_when_deleted(echo_server):
    """What the Agents SDK's updateHistory sends: a system note and an earlier assistant reply, as items."""
    echo_server.wait_idle()
    with connect(echo_server) as connection:
        events = Events(connection)
        session_id = events.until("session.created", 30).session.id
        connection.conversation.item.create(item={"type": "message", "role": "system",
                                                  "content": [{"type": "input_text", "text": "The user is Ada."}]})
        note = events.until("conversation.item.added", 30)
        connection.conversation.item.create(item={"type": "message", "role": "assistant",
                                                  "content": [{"type": "output_text", "text": "Hello, Ada."}]})
        said = events.until("conversation.item.added", 30, lambda e: e.item.role == "assistant")
        assert note.item.role == "system" and said.previous_item_id == note.item.id
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Who am I?"}]})
        connection.response.create()
        assert events.until("response.done", 120).response.status == "completed"

        def history() -> list[dict]:
            _, document = echo_server.get("/v1/sessions")
            return next(s for s in document["sessions"] if s["id"] == session_id)["history"]

        assert history() == [{"role": "system", "content": "The user is Ada."},
                             {"role": "assistant", "content": "Hello, Ada."},
                             {"role": "user", "content": "Who am I?"}, {"role": "assistant", "content": "Who am I?"}]
        connection.conversation.item.delete(item_id=said.item.id)
        events.until("conversation.item.deleted", 30)
        assert {"role": "assistant", "content": "Hello, Ada."} not in history()
        connection.send_raw(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "developer", "content": [{"type": "input_text", "text": "x"}]}}))
        error = events.until("error", 30).error
        assert error.param == "item.role" and "user, system, assistant" in error.message
        assert not [e for e in events.all if e.type == "error" and e is not events.of("error")[-1]]


def test_a_text_only_session_or_response_gets_text_events_and_no_audio(echo_server):
    """output_modalities ["text"]: the reply streams as response.output_text.*, the TTS says nothing."""
    echo_server.wait_idle()
    with connect(echo_server) as connection:
        events = Events(connection)
        events.until("session.created", 30)
        connection.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        assert events.until("session.updated", 30).session.output_modalities == ["text"]
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hello there."}]})
        connection.response.create()
        done = events.until("response.done", 120)
        assert done.response.status == "completed" and done.response.output_modalities == ["text"]
        assert done.response.output[0].content[0].type == "output_text"
        assert "Hello there" in events.of("response.output_text.done")[-1].text
        assert "".join(e.delta for e in events.of("response.output_text.delta")).strip() == "Hello there."
        assert not events.of("response.output_audio.delta") and not events.of("response.output_audio.done")

        connection.session.update(session={"type": "realtime", "output_modalities": ["audio"]})
        events.until("session.updated", 30)
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Good morning."}]})
        connection.response.create(response={"output_modalities": ["text"]})  # this response alone
        second = events.until("response.done", 120, lambda e: e.response.id != done.response.id)
        assert second.response.output_modalities == ["text"] and not events.of("response.output_audio.delta")
        connection.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Say it aloud."}]})
        connection.response.create()  # the session's modality again: spoken
        third = events.until("response.done", 120, lambda e: e.response.id not in (done.response.id,
                                                                                  second.response.id))
        assert third.response.output_modalities == ["audio"] and events.of("response.output_audio.delta")


def test_a_reply_held_by_its_reader_does_not_hold_another_sessions_reply():
    """Generation is paced by its reader (a session waits for its TTS): with one CTranslate2 worker for the shared
    weights, a second session's reply would wait for the first's to end; each pipeline gets a worker."""
    from concurrent.futures import ThreadPoolExecutor

    from s2s import sharing
    from s2s.llm.ctranslate2_lm import CTranslate2LM
    from s2s.platform import threads_per_pipeline

    sharing.enable(users=2)
    try:
        stages = [CTranslate2LM(max_new_tokens=64), CTranslate2LM(max_new_tokens=64)]
        for stage in stages:
            stage.threads = threads_per_pipeline(2)
            stage.setup()
        assert sharing.shared_count() == 1 and stages[0]._generator is stages[1]._generator
        assert stages[0]._generator.num_generators == 2
        held = stages[0].stream(stages[0].chat_messages("Tell me a long story about a dog."))
        next(held)  # the reader stops here: the first session's worker waits for it
        pool = ThreadPoolExecutor(1)
        try:
            other = pool.submit(lambda: next(stages[1].stream(stages[1].chat_messages("What is the capital?"))))
            assert other.result(timeout=60)  # the second session's first words come while the first's are held
        finally:
            held.close()  # frees the first worker, so a failing run ends too
            pool.shutdown(wait=True)
    finally:
        for stage in stages:
            stage.close()
        sharing.enable(False)


def test_each_pipeline_gets_its_share_of_the_cores():
    import os

    from s2s.platform import threads_per_pipeline

    cores = len(os.sched_getaffinity(0))
    assert threads_per_pipeline(1) is None  # one pipeline: the libraries decide, as in a local run
    assert threads_per_pipeline(2) == max(1, cores // 2) and threads_per_pipeline(64) == 1
    # a Ray replica's pipelines share the CPUs Ray reserved for it (server.replica_cpus), even a lone one
    assert threads_per_pipeline(1, cores=3) == 3 and threads_per_pipeline(2, cores=4) == 2
    assert threads_per_pipeline(4, cores=1) == 1


def test_a_servers_pipelines_share_the_cores_and_take_turns_when_they_outnumber_them():
    from s2s import sharing, turn_order
    from s2s.config import StageSpec
    from s2s.server.pipelines import share_cores, unshare

    from s2s.llm.echo import EchoLM
    from s2s.stt.faster_whisper import FasterWhisperSTT

    specs = [StageSpec("stt", "s2s.stt.faster_whisper.FasterWhisperSTT", FasterWhisperSTT, {}),
             StageSpec("llm", "s2s.llm.echo.EchoLM", EchoLM, {}, threads=2)]  # runner.threads.llm=2 wins
    try:
        shared = share_cores(specs, 4, cores=2)  # four sessions in a 2-CPU replica
        assert [spec.threads for spec in shared] == [1, 2] and sharing.users() == 4
        assert turn_order.slots() == 1  # its widest library fills both CPUs: one call at a time
        shared = share_cores(specs[:1], 2, cores=2)
        assert shared[0].threads == 1 and turn_order.slots() is None  # a core each: no order needed
    finally:
        unshare()
    assert turn_order.slots() is None and sharing.users() == 1

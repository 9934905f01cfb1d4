"""The realtime server on the embedded default (Whisper tiny.en, SmolLM2, Kokoro ONNX), through the openai SDK.

One real server for the module (two pipelines, short replies); Whisper listens to the replies.
"""
from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
import soundfile

from realtime_server import Events, RunningServer, openai_client, pcm16, reply_audio, send_speech

pytest.importorskip("websockets")
pytest.importorskip("openai")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = RunningServer(tmp_path_factory.mktemp("server"), "llm.max_new_tokens=24", "server.max_sessions=2",
                            env={"S2S_API_KEY": ""})
    yield running
    assert running.stop() == 0, running.output[-3000:]


@pytest.fixture(scope="module")
def whisper():
    from faster_whisper import WhisperModel

    from s2s.stt.faster_whisper import resolve_model

    model = WhisperModel(resolve_model("tiny.en"), device="cpu", compute_type="int8")

    def transcribe(path: Path) -> str:
        segments, _ = model.transcribe(str(path), language="en", beam_size=5)
        return " ".join(segment.text.strip() for segment in segments)

    return transcribe


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z']+", text.lower()))


def ask(server, question: Path) -> Events:
    with openai_client(server, "unused").realtime.connect(model="s2s") as connection:
        events = Events(connection)
        events.until("session.created", 60)
        send_speech(connection, pcm16(question))
        events.until("response.done", 300)
    return events


def test_a_spoken_question_is_heard_answered_aloud_and_the_answer_is_intelligible(server, espeak, whisper,
                                                                                 tmp_path):
    events = ask(server, espeak("What is the capital of France?", tmp_path / "question.wav"))
    kinds = [event.type for event in events.all]
    order = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
             "conversation.item.input_audio_transcription.completed", "response.created",
             "response.output_audio.delta", "response.output_audio.done", "response.output_audio_transcript.done",
             "response.done"]
    assert [kinds.index(kind) for kind in order] == sorted(kinds.index(kind) for kind in order), kinds
    heard = events.of("conversation.item.input_audio_transcription.completed")[0].transcript
    assert "capital" in heard.lower()
    done = events.of("response.done")[-1]
    assert done.response.status == "completed"
    said = events.of("response.output_audio_transcript.done")[-1].transcript
    deltas = "".join(e.delta for e in events.of("response.output_audio_transcript.delta"))
    assert said and deltas.split() == said.split()
    samples = reply_audio(events.all, done.response.id)
    assert len(samples) > 24000 * 0.5
    soundfile.write(tmp_path / "reply.wav", samples, 24000, subtype="PCM_16")
    heard_back = whisper(tmp_path / "reply.wav")
    spoken = {word for word in words(said) if len(word) > 3}
    assert spoken and len(spoken & words(heard_back)) >= len(spoken) / 2, (said, heard_back)


def test_two_concurrent_sessions_both_get_their_replies(server, espeak, tmp_path):
    questions = [espeak("What is the capital of France?", tmp_path / "a.wav"),
                 espeak("Tell me about the sun.", tmp_path / "b.wav")]
    results: dict[int, Events] = {}
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = ask(server, questions[index])
        except BaseException as error:  # surfaced below, in the test's thread
            failures.append(error)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(400)
    assert not failures, failures
    ids = {results[i].of("session.created")[0].session.id for i in range(2)}
    assert len(ids) == 2
    for index in range(2):
        done = results[index].of("response.done")[-1]
        assert done.response.status == "completed"
        assert len(reply_audio(results[index].all, done.response.id)) > 24000 * 0.3
    heard = [results[i].of("conversation.item.input_audio_transcription.completed")[0].transcript.lower()
             for i in range(2)]
    assert "capital" in heard[0] and "sun" in heard[1], heard


def test_each_session_has_the_figures_of_a_local_run(server):
    status, document = server.get("/v1/sessions", api_key=None)
    assert status == 200
    answered = [session for session in document["sessions"] if session["summary"]["turns"]]
    assert len(answered) >= 3
    for session in answered:
        timings = session["turns"][0]["timings"]
        assert timings["voice_to_voice_s"] > 0 and timings["stt_s"] > 0 and timings["tts_first_audio_s"] > 0
        metrics = json.loads(Path(session["metrics_path"]).read_text())
        assert metrics["turns"][0]["timings"]["voice_to_voice_s"] == pytest.approx(timings["voice_to_voice_s"])
        assert "user" not in session["turns"][0]  # words only with server.log_transcripts=true
        assert not (Path(session["metrics_path"]).parent / "transcript.jsonl").exists()

"""Speculative end of turn: work starts after a short silence, nothing of a dropped attempt reaches anyone."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import trimmed
from graph_stages import Collector, CountingSource, Recognizer, Speculator, Voice
from s2s import audio
from s2s.graph import Graph
from s2s.llm.echo import EchoLM
from s2s.messages import AudioChunk, ReplyAudio, SpeechSegment, SpeechStarted, TurnConfirmed, TurnDiscarded
from s2s.metrics import Recorder
from s2s.vad.silero import SileroVAD


def run(script: list[str], tmp_path, delay_s: float = 0.15):
    vad, llm, sink = Speculator(script), EchoLM(), Collector()
    recorder = Recorder(tmp_path)
    graph = Graph([("source", CountingSource(turns=len(script), delay_s=delay_s)), ("vad", vad),
                   ("stt", Recognizer()), ("llm", llm), ("tts", Voice()), ("sink", sink)], recorder)
    graph.setup()
    result = graph.run()
    graph.close()
    recorder.finish(result.status)
    lines = [json.loads(line) for line in (tmp_path / "transcript.jsonl").read_text().splitlines()]
    return vad, llm, sink, lines, json.loads((tmp_path / "metrics.json").read_text())


def test_a_turn_that_resumes_gets_one_reply_from_the_whole_turn_and_nothing_from_the_dropped_attempt(tmp_path):
    vad, llm, sink, lines, metrics = run(["speak", "spec", "speak", "discard", "spec", "speak", "confirm"], tmp_path)
    assert {m.turn for _, m in sink.received} == {1}  # no audio of attempt 0 ever reached the sink
    assert [line["turn"] for line in lines] == [1] and lines[0]["user"] == "turn 1"
    assert [m["content"] for m in llm.context.history()] == ["turn 1", "turn 1"]  # the history holds the kept turn only
    assert [turn["turn"] for turn in metrics["turns"]] == [1]


def test_reply_audio_waits_for_the_confirmation(tmp_path):
    vad, _, sink, lines, _ = run(["speak", "spec", "speak", "speak", "confirm"], tmp_path)
    confirmed = next(at for action, _, at in vad.times if action == "confirm")
    assert sink.received and all(at >= confirmed for at, _ in sink.received)
    [line] = lines
    timings = line["timings"]
    assert timings["held_s"] > 0.2  # ready about three chunks before the confirmation
    # on the input clock: speech ended at 0.3 s, the confirmation came at 2.0 s, the audio right after it
    assert timings["speech_end_at_s"] == pytest.approx(0.3)
    assert timings["first_audio_at_s"] >= 2.0 and timings["voice_to_voice_s"] >= 1.7
    assert timings["endpoint_s"] == pytest.approx(0.2) and timings["confirm_s"] == pytest.approx(1.7)


def test_an_unconfirmed_attempt_at_the_end_leaves_no_trace(tmp_path):
    _, llm, sink, lines, metrics = run(["speak", "spec"], tmp_path)
    assert sink.received == [] and lines == [] and metrics["summary"]["turns"] == 0


# ---------------------------------------------------------------- the real Silero VAD
@pytest.fixture(scope="module")
def paused_question(espeak, tmp_path_factory):
    """'What is the capital' ... 0.4 s ... 'of France?': a pause longer than the speculative silence."""
    folder = tmp_path_factory.mktemp("spec")
    first = trimmed(audio.read_audio(espeak("What is the capital", folder / "a.wav"), 16000))
    second = trimmed(audio.read_audio(espeak("of France?", folder / "b.wav"), 16000))
    lead = audio.silence(0.5, 16000)
    return np.concatenate([lead, first, audio.silence(0.4, 16000), second, audio.silence(1.0, 16000)])


def vad_messages(samples, **kwargs):
    vad = SileroVAD(**kwargs)
    vad.setup()
    out = []
    for block in audio.chunks(samples, 512):
        out += list(vad.process(AudioChunk(block, 16000)))
    return out + list(vad.flush())


def test_silero_speculates_discards_on_resumed_speech_and_confirms_the_whole_turn(paused_question):
    # Silero's silence alone: the quiet start is tests/test_real_speech.py's
    out = vad_messages(paused_question, speculative_silence_ms=200, min_silence_ms=600, quiet_below=None)
    kinds = [(type(m).__name__, m.turn) for m in out]
    assert kinds == [("SpeechStarted", 0), ("SpeechSegment", 0), ("TurnDiscarded", 0), ("SpeechSegment", 1),
                     ("TurnConfirmed", 1)], kinds
    first, whole = [m for m in out if isinstance(m, SpeechSegment)]
    assert first.speculative and whole.speculative
    assert whole.start_s == first.start_s and whole.duration_s > first.duration_s + 0.5  # the whole utterance
    assert whole.closed_s - whole.speech_end_s == pytest.approx(0.2, abs=0.07)
    confirmed = out[-1]
    assert confirmed.at_s - whole.speech_end_s == pytest.approx(0.6, abs=0.07)
    assert whole.speech_end_s == pytest.approx(len(paused_question) / 16000 - 1.0, abs=0.25)


def test_silero_without_speculation_closes_once(paused_question):
    out = vad_messages(paused_question, speculative_silence_ms=None, min_silence_ms=600)
    segments = [m for m in out if isinstance(m, SpeechSegment)]
    assert [s.speculative for s in segments] == [False]
    assert not [m for m in out if isinstance(m, (TurnConfirmed, TurnDiscarded))]
    assert [m.turn for m in out if isinstance(m, SpeechStarted)] == [0]


def test_speculative_silence_must_be_shorter_than_the_confirming_one(tmp_path):
    from conftest import compose_config
    from s2s.config import validate
    from s2s.config_errors import ConfigErrors

    with pytest.raises(ConfigErrors, match=r"vad.speculative_silence_ms=600: invalid; expected null or less than"):
        validate(compose_config(["vad.speculative_silence_ms=600", "vad.min_silence_ms=600"], tmp_path))


def test_reply_audio_never_plays_for_a_discarded_attempt_on_the_real_pipeline_shape(tmp_path, paused_question):
    """The real VAD in the real runner with the echo LLM: one reply, built from the whole paused question."""
    import soundfile

    from s2s.io.file import FileSource

    path = tmp_path / "paused.wav"
    soundfile.write(path, paused_question, 16000)
    sink = Collector()
    recorder = Recorder(tmp_path)
    stt = Recognizer()
    graph = Graph([("source", FileSource(str(path), realtime=True)), ("vad", SileroVAD()), ("stt", stt),
                   ("llm", EchoLM()), ("tts", Voice()), ("sink", sink)], recorder)
    graph.setup()
    result = graph.run()
    graph.close()
    recorder.finish(result.status)
    turns = {m.turn for _, m in sink.received if isinstance(m, ReplyAudio)}
    assert turns == {1}
    [line] = [json.loads(line) for line in (tmp_path / "transcript.jsonl").read_text().splitlines()]
    assert line["turn"] == 1 and line["user"] == "turn 1"
    assert 0.5 < line["timings"]["voice_to_voice_s"] < 3.0  # realtime: the confirming silence is waited for

"""The runner with small stages defined in tests: order, streaming, draining, failures, signals, barge-in."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from graph_stages import Collector, CountingSource, Recognizer, Segmenter, Talker, Voice
from s2s.graph import Graph
from s2s.metrics import Recorder

ROOT = Path(__file__).resolve().parent.parent


def chain(source=None, segmenter=None, recognizer=None, talker=None, voice=None, sink=None):
    return [("source", source or CountingSource()), ("vad", segmenter or Segmenter()),
            ("stt", recognizer or Recognizer()), ("llm", talker or Talker()), ("tts", voice or Voice()),
            ("sink", sink or Collector())]


def run_graph(stages, **kwargs):
    graph = Graph(stages, **kwargs)
    graph.setup()
    try:
        return graph, graph.run()
    finally:
        graph.close()


def test_messages_arrive_in_order_and_turns_end():
    sink = Collector()
    _, result = run_graph(chain(source=CountingSource(turns=3), sink=sink))
    assert result.status == "completed" and result.exit_code == 0
    texts = [(m.turn, m.samples.shape[0]) for _, m in sink.received]
    assert [turn for turn, _ in texts] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert sink.turn_ends == [0, 1, 2]
    assert sink.closed


def test_flush_drains_buffered_output_at_end_of_input():
    sink = Collector()
    run_graph(chain(source=CountingSource(turns=2), segmenter=Segmenter(hold_last=True), sink=sink))
    assert sorted({m.turn for _, m in sink.received}) == [0, 1]  # turn 1 only existed in the VAD's buffer


def test_first_output_reaches_the_sink_before_the_producer_finishes():
    sink = Collector()
    start = time.perf_counter()
    run_graph(chain(source=CountingSource(turns=1), talker=Talker(words=3, pause_s=0.3), sink=sink))
    arrivals = [t - start for t, _ in sink.received]
    assert len(arrivals) == 3
    # the first sentence's audio arrived while the talker was still pausing before the second one
    assert arrivals[1] - arrivals[0] > 0.2 and arrivals[0] < arrivals[2] - 0.4


@pytest.mark.parametrize("wait_s", [2.0, 0.0])
def test_the_llm_pauses_after_its_first_sentence_until_the_tts_has_made_it_into_audio(wait_s):
    talker, voice = Talker(words=3), Voice(delay_s=0.3)
    run_graph(chain(source=CountingSource(turns=1), talker=talker, voice=voice), first_audio_wait_s=wait_s)
    assert len(talker.made) == 3 and len(voice.made) == 3
    if wait_s:  # the second sentence is made only once the first one's audio exists: they never share the CPU
        assert talker.made[1] >= voice.made[0]
    else:  # off: the talker runs ahead of the voice
        assert talker.made[2] < voice.made[0]


def test_a_first_sentence_that_makes_no_audio_ends_the_pause_at_once():
    talker, voice = Talker(words=3), Voice(samples=0)
    start = time.perf_counter()
    _, result = run_graph(chain(source=CountingSource(turns=2), talker=talker, voice=voice), first_audio_wait_s=30.0)
    assert result.status == "completed" and len(talker.made) == 6
    assert time.perf_counter() - start < 15.0  # two turns would wait 30 s each if the empty piece kept the pause


def test_failing_stage_stops_the_graph_quickly_and_names_itself():
    sink = Collector()
    started = time.perf_counter()
    graph, result = run_graph(chain(source=CountingSource(turns=1000, forever=True, delay_s=0.001),
                                    recognizer=Recognizer(fail_on_turn=2), sink=sink))
    assert time.perf_counter() - started < 2.5
    assert result.status == "failed" and result.exit_code == 1
    assert result.failure.stage == "stt"
    assert "cannot recognise turn 2" in str(result.failure) and "stage 'stt'" in str(result.failure)
    assert sink.closed
    assert {m.turn for _, m in sink.received} <= {0, 1}




@pytest.mark.parametrize("warm_up", [True, False])
def test_stages_are_warmed_up_after_setup_unless_disabled(warm_up):
    class Counting(Voice):
        calls: list[str] = []

        def setup(self):
            self.calls.append("setup")

        def warm_up(self):
            self.calls.append("warm_up")

    voice = Counting()
    voice.calls = []
    Graph(chain(voice=voice)).setup(warm_up=warm_up)
    assert voice.calls == (["setup", "warm_up"] if warm_up else ["setup"])


def test_setup_failure_names_the_stage():
    from s2s.graph import StageSetupError

    class Broken(Voice):
        def setup(self):
            raise OSError("no such model")

    graph = Graph(chain(voice=Broken()))
    with pytest.raises(StageSetupError, match="stage 'tts' could not start: no such model"):
        graph.setup()


def test_recorder_turns_into_transcript_and_metrics(tmp_path):
    recorder = Recorder(tmp_path)
    _, result = run_graph(chain(source=CountingSource(turns=2), talker=Talker(words=2)), observer=recorder)
    recorder.finish(result.status)
    lines = [json.loads(line) for line in (tmp_path / "transcript.jsonl").read_text().splitlines()]
    assert [(line["turn"], line["user"], line["assistant"]) for line in lines] == [
        (0, "turn 0", "turn 0 word 0. turn 0 word 1."), (1, "turn 1", "turn 1 word 0. turn 1 word 1.")]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["summary"]["completed_turns"] == 2
    timings = metrics["turns"][0]["timings"]
    assert timings["voice_to_voice_s"] > 0 and timings["stt_s"] >= 0 and timings["tts_first_audio_s"] >= 0
    assert timings["tts_rtf"] >= 0 and metrics["turns"][0]["reply_audio_s"] == pytest.approx(0.2)


def test_voice_to_voice_counts_the_silence_leading_the_first_reply_block(tmp_path):
    """The user hears the reply when its sound starts, not when a block of silence reaches the speaker."""
    import numpy as np

    from s2s.messages import ReplyAudio, SpeechSegment

    recorder = Recorder(tmp_path)
    recorder.on_output("vad", SpeechSegment(np.zeros(1600, np.float32), 16000, 0, 0.0, 1.1, speech_end_s=1.0,
                                            closed_s=1.2), now=10.0)
    block = np.concatenate([np.zeros(2400, np.float32), np.full(2400, 0.3, np.float32)])  # 0.1 s, then sound
    recorder.on_input("sink", ReplyAudio(block, 24000, 0), now=11.0)
    timings = recorder.turns[0].figures()
    assert timings["first_audio_at_s"] == pytest.approx(1.2 + 1.0 + 0.1)
    assert timings["voice_to_voice_s"] == pytest.approx(1.3)


def test_a_resumed_turn_says_which_turn_it_went_on_from_and_the_input_it_spans(tmp_path):
    import numpy as np

    from s2s.messages import SpeechSegment

    recorder = Recorder(tmp_path)
    # 2.0 s of input whose 1.2 s pause the VAD cut to 0.3 s (vad.gap_ms): 1.1 s of samples
    recorder.on_output("vad", SpeechSegment(np.zeros(17600, np.float32), 16000, 3, 0.5, 2.5, speech_end_s=2.4,
                                            closed_s=2.6, resumes=2), now=10.0)
    record = recorder.turns[3].record()
    assert record["resumes"] == 2 and record["user_audio_s"] == pytest.approx(2.0)
    recorder.on_output("vad", SpeechSegment(np.zeros(1600, np.float32), 16000, 4, 3.0, 3.1), now=11.0)
    assert "resumes" not in recorder.turns[4].record()


def test_turns_without_words_leave_no_transcript_line(tmp_path):
    recorder = Recorder(tmp_path)
    _, result = run_graph(chain(source=CountingSource(turns=3), recognizer=Recognizer(wordless_turns=(1,))),
                          observer=recorder)
    recorder.finish(result.status)
    lines = [json.loads(line) for line in (tmp_path / "transcript.jsonl").read_text().splitlines()]
    assert [line["turn"] for line in lines] == [0, 2]
    assert json.loads((tmp_path / "metrics.json").read_text())["summary"]["turns"] == 2


def test_a_message_the_stage_does_not_accept_stops_the_graph_clearly():
    _, result = run_graph([("source", CountingSource(turns=1)), ("stt", Recognizer()), ("sink", Collector())])
    assert result.status == "failed" and result.failure.stage == "stt"
    assert "accepts SpeechSegment, not AudioChunk" in str(result.failure)


def test_barge_in_cancels_the_reply_in_progress():
    sink = Collector()
    talker = Talker(words=20, pause_s=0.1)
    run_graph(chain(source=CountingSource(turns=2, delay_s=0.4), segmenter=Segmenter(announce=True),
                    talker=talker, sink=sink), barge_in=True)
    turn0 = [m for _, m in sink.received if m.turn == 0]
    turn1 = [m for _, m in sink.received if m.turn == 1]
    assert 0 < len(turn0) < 20, "turn 0's reply was cut when the user spoke again"
    assert len(turn1) == 20
    assert talker.closed_early == 1


def test_half_duplex_ignores_a_live_source_until_the_reply_ends():
    class Live(CountingSource):
        live = True

    sink, segmenter = Collector(), Segmenter()
    run_graph(chain(source=Live(turns=30, delay_s=0.01), segmenter=segmenter, talker=Talker(words=2, pause_s=0.1),
                    sink=sink))
    turns = sorted({m.turn for _, m in sink.received})
    assert 1 <= len(turns) < 30  # chunks that came while the assistant was replying were not answered
    # ... they were heard as silence, so the VAD's clock kept the source's time (a pause it keeps stays true)
    assert segmenter.silent == 30 - segmenter.turn and segmenter.silent > 0


SIGNAL_SCRIPT = textwrap.dedent("""
    import sys, json
    sys.path[:0] = [{tests!r}, {root!r}]
    from graph_stages import *
    from s2s.app import signals_as_interrupt
    from s2s.graph import Graph
    from s2s.metrics import Recorder
    recorder = Recorder({out!r})
    graph = Graph([("source", CountingSource(turns=10**6, delay_s=0.05)), ("vad", Segmenter()),
                   ("stt", Recognizer(slow_s={slow})), ("llm", Talker()), ("tts", Voice()), ("sink", Collector())],
                  recorder)
    graph.setup()
    print("running", flush=True)
    with signals_as_interrupt():
        result = graph.run()
    graph.close()
    recorder.finish(result.status)
    sys.exit(result.exit_code)
""")


@pytest.mark.parametrize("signum,slow", [(signal.SIGINT, 0.0), (signal.SIGTERM, 0.0), (signal.SIGINT, 60.0)],
                         ids=["sigint", "sigterm", "sigint-while-a-stage-is-stuck"])
def test_signal_stops_the_graph_and_keeps_outputs_valid(tmp_path, signum, slow):
    script = SIGNAL_SCRIPT.format(tests=str(ROOT / "tests"), root=str(ROOT), out=str(tmp_path), slow=slow)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "running"
    time.sleep(0.5)
    sent = time.perf_counter()
    process.send_signal(signum)
    process.wait(timeout=10)
    assert time.perf_counter() - sent < 3
    assert process.returncode == 128 + signum, process.stderr.read()  # 130 after Ctrl-C, 143 after SIGTERM
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["status"] == "interrupted"
    lines = (tmp_path / "transcript.jsonl").read_text().splitlines()
    assert all(json.loads(line)["turn"] >= 0 for line in lines)
    assert lines or slow  # a stuck recogniser never finished a turn


def test_the_runner_tells_every_stage_whether_speech_cancels_the_reply():
    """The VAD resumes a turn the speaker goes on from only when the reply to it can be cut (vad.resume_ms)."""
    stages = chain()
    graph = Graph(stages, barge_in=True)
    assert all(stage.barge_in for _, stage in stages)
    graph.barge_in = False  # a realtime session's interrupt_response, turned off
    assert not any(stage.barge_in for _, stage in stages)

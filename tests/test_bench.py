"""Benchmarks: WER scoring, the round-trip sink on real Whisper, the TTS benchmark sweep, the runner benchmark."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, compose_config, run_cli
from s2s import audio
from s2s.bench.roundtrip import RoundTripSink, whisper_normalised_errors, word_error_rate
from s2s.bench.runner import bench_runner
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.io.sentences import SentenceSource
from s2s.messages import Metric, ReplyAudio, ReplyText, TurnEnd
from s2s.platform import PLATFORMS


def test_word_error_rate_ignores_case_and_punctuation():
    reference = "Hello, world! It's a well-known test."
    assert word_error_rate(reference, "hello world its a well known test") == 0.0
    # one substitution (world -> word) and one deletion (test) out of 7 reference words
    assert word_error_rate(reference, "Hello word, it's a well known.") == pytest.approx(2 / 7)
    assert word_error_rate(reference, "") == 1.0
    assert word_error_rate("yes", "yes yes yes") == 2.0  # insertions count: WER is not capped at 1


def test_whisper_normaliser_forgives_spelling_not_mishearing():
    # the real set's own transcripts against what tiny.en heard: digits and "gonna" are spelling, "close" is not
    assert word_error_rate("Go forward ten meters.", "Go forward 10 meters.") == 0.25
    assert whisper_normalised_errors("Go forward ten meters.", "Go forward 10 meters.") == (0, 4)
    assert whisper_normalised_errors("Eight of spades, four of clubs, seven of hearts.",
                                     "8 of spades, 4 of close, 7 of hearts.") == (1, 9)
    assert whisper_normalised_errors("where we're gonna tackle", "where we are going to tackle") == (0, 6)
    assert whisper_normalised_errors("Hello.", "") == (1, 1) and whisper_normalised_errors("", "Hi.") == (1, 0)


def test_sentence_source_emits_one_turn_per_sentence():
    source = SentenceSource(["One.", "Two words."], language="en")
    assert list(source.stream()) == [ReplyText("One.", 0, "en"), TurnEnd(0), ReplyText("Two words.", 1, "en"),
                                     TurnEnd(1)]


def test_the_tts_benchmark_is_an_experiment_and_bench_only_the_package():
    from s2s.compose import config_groups, group_options

    assert group_options("experiment") == ["tts_benchmark"] and "bench" not in config_groups()


def test_tts_benchmark_config_and_its_rules(tmp_path):
    for platform in PLATFORMS:
        specs = validate(compose_config(["experiment=tts_benchmark", f"platform={platform}"], tmp_path))
        assert [spec.group for spec in specs] == ["source", "tts", "sink"]
        assert specs[2].kwargs["references"] == specs[0].kwargs["sentences"]  # declared once, interpolated
        assert len(specs[0].kwargs["sentences"]) == 5
    with pytest.raises(ConfigErrors, match=r"source.sentences=\[\]: invalid; expected a non-empty list"):
        validate(compose_config(["experiment=tts_benchmark", "source.sentences=[]"], tmp_path))
    with pytest.raises(ConfigErrors, match=r"sink.references=\[\]: invalid; expected null or a non-empty list"):
        validate(compose_config(["experiment=tts_benchmark", "sink.references=[]"], tmp_path))


def test_roundtrip_sink_scores_real_speech_with_whisper(espeak, tmp_path):
    """espeak-ng speech for turn 0 (heard right), nothing for turn 1 (all words missed), turn 2 unreferenced."""
    said = "Please open the window in the kitchen."
    speech, rate = audio.read_audio(espeak(said, tmp_path / "said.wav"), 22050), 22050
    sink = RoundTripSink(references=[said, "This turn produced no audio."], save_dir=str(tmp_path / "out"))
    sink.setup()
    try:
        blocks = list(audio.chunks(speech, 4096))  # streamed blocks, as a TTS delivers them
        for block in blocks:
            assert list(sink.process(ReplyAudio(block, rate, 0))) == []
        list(sink.process(ReplyAudio(speech[:rate], rate, 2)))
        metrics = list(sink.flush())
    finally:
        sink.close()
    assert [(m.turn, m.name) for m in metrics] == [(0, "wer"), (1, "wer")]
    assert all(isinstance(m, Metric) for m in metrics)
    assert metrics[0].value <= 0.15, metrics[0].extra  # tiny.en hears espeak's sentence (at most one slip)
    assert metrics[1].value == 1.0 and metrics[1].extra["heard"] == ""
    records = [json.loads(line) for line in (tmp_path / "out" / "roundtrip.jsonl").read_text().splitlines()]
    assert [r["turn"] for r in records] == [0, 1, 2]
    assert records[0]["reference"] == said and records[0]["wer"] == round(metrics[0].value, 4)
    assert records[2]["reference"] is None and records[2]["wer"] is None  # heard, not scored
    collected = np.concatenate(blocks)
    assert records[0]["audio_s"] == pytest.approx(len(collected) / rate, abs=1e-3)
    saved = audio.read_audio(tmp_path / "out" / "turn_0.wav", rate)
    np.testing.assert_allclose(saved, collected, atol=1e-4)  # the turn's blocks, joined in order


def test_tts_benchmark_sweep_reports_wer(tmp_path):
    """python run.py -m experiment=tts_benchmark over two voices: per-job WER, first audio, RTF and a WER column."""
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "experiment=tts_benchmark", "tts=kokoro_onnx", "tts.voice=jf_alpha,jm_kumo",
                     "source.sentences=[The quick brown fox jumps over the lazy dog.]",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for job in ("0", "1"):
        metrics = json.loads((sweep / job / "metrics.json").read_text())
        assert metrics["status"] == "completed"
        turn = metrics["turns"][0]
        assert turn["assistant"] == "The quick brown fox jumps over the lazy dog."
        assert turn["reported"]["wer"] <= 0.5, (sweep / job / "roundtrip.jsonl").read_text()
        assert metrics["summary"]["median"]["wer"] == turn["reported"]["wer"]
        assert turn["timings"]["tts_first_audio_s"] > 0 and turn["timings"]["tts_rtf"] > 0
        assert (sweep / job / "turn_0.wav").exists()
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert [row["label"] for row in rows] == ["tts.voice=jf_alpha", "tts.voice=jm_kumo"]
    assert all(float(row["wer"]) <= 0.5 and float(row["tts_first_audio_s"]) > 0 for row in rows)
    table = (sweep / "summary.md").read_text()
    assert "| WER |" in table and "TTS first audio (s)" in table
    assert "voice-to-voice" not in table  # no STT in a TTS benchmark: the empty columns are left out


def test_runner_benchmark_prints_sane_figures():
    figures = bench_runner(messages=200, stages=4, interval_s=0.0005)
    assert 0 < figures.hop_p50_s <= figures.hop_p99_s < 1.0
    assert figures.hop_p50_s <= figures.end_to_end_p50_s  # three hops take longer than one
    assert figures.throughput_per_s > 100
    result = subprocess.run([sys.executable, "-m", "s2s.bench", "runner", "--messages", "100", "--stages", "3"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    hop = re.search(r"per-hop latency\s+p50 (\d+) us\s+p99 (\d+) us", result.stdout)
    throughput = re.search(r"throughput\s+([\d,]+) messages/s", result.stdout)
    assert hop and throughput, result.stdout
    assert 0 < int(hop[1]) <= int(hop[2]) and int(throughput[1].replace(",", "")) > 0


@pytest.mark.slow
def test_latency_benchmark_prints_true_voice_to_voice_per_file_and_percentiles(tmp_path, espeak):
    question = espeak("Good morning to you.", tmp_path / "q.wav")
    result = subprocess.run([sys.executable, "-m", "s2s.bench", "latency", str(question), "llm=echo",
                             "--trailing-s", "1.5", "--versus", "runner.first_audio_wait_s=0"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| true voice-to-voice | from the VAD's end | endpoint | STT |" in result.stdout
    assert "**p50**" in result.stdout
    [folder] = (tmp_path / "outputs").glob("*/*-latency")
    report = json.loads((folder / "latency.json").read_text())
    [row] = report["rows"]
    assert "morning" in row["transcript"].lower() and row["first_chunk"]
    assert row["voice_to_voice_s"] > row["endpoint_s"] > 0  # from the end of speech, endpointing included
    # from the file's own end of speech, which lies within a few VAD frames of Silero's last voiced one
    assert abs(row["true_voice_to_voice_s"] - row["voice_to_voice_s"]) < 0.3
    assert report["peak_memory_mb"] > 0 and (folder / "00" / "metrics.json").exists()
    # --versus: the same file again with the extra override, its own folder and rows, and the ratio of the two
    [other] = report["versus_rows"]
    assert report["versus"] == ["runner.first_audio_wait_s=0"] and (folder / "00-vs" / "metrics.json").exists()
    assert "morning" in other["transcript"].lower() and other["voice_to_voice_s"] > 0
    assert re.search(r"ratio \d+\.\d\d, same run", result.stdout)
    # startup and intelligibility: the echoed reply ("Good morning to you.") is heard back by Whisper
    assert re.search(r"models ready in \d+\.\d\d s", result.stdout)
    assert len(report["reply_wer"]) == 1 and report["reply_wer"][0] <= 0.5, report["reply_wer"]


def test_answer_benchmark_scores_the_llm_stage_alone(tmp_path, monkeypatch):
    """The tiny tool-calling LM (llm=ctranslate2) knows one of these two answers; nothing but the LLM is built."""
    from conftest import CACHE

    from s2s.bench.answers import bench_answers
    from s2s.bench.questions import hit
    from tests.fixtures import llm_models, weather_tools

    assert hit("It's 8 legs.", ("eight", "8")) and not hit("18 legs", ("eight", "8"))
    assert hit("Leonardo da Vinci!", ("da vinci",)) and not hit("Lima", ("lim",))
    monkeypatch.chdir(tmp_path)
    model = llm_models.tool_lm("native", CACHE / "models")
    questions = [(weather_tools.CAPITAL, ("paris",)), ("What is the capital of Japan?", ("tokyo",))]
    overrides = ["llm=ctranslate2", f"llm.model={model}", "llm.compute_type=float32", "llm.system_prompt=null",
                 f"llm.cache_dir={CACHE / 'models'}"]
    assert bench_answers(overrides, questions) == 0
    [report] = tmp_path.glob("outputs/*/*-answers/answers.json")
    result = json.loads(report.read_text())
    assert result["summary"]["score"] == 0.5 and result["summary"]["hits"] == 1
    assert [row["hit"] for row in result["rows"]] == [True, False]
    assert result["rows"][0]["reply"] == weather_tools.CAPITAL_REPLY
    assert 0 < result["summary"]["first_words_median_s"] < 5 and result["summary"]["peak_memory_mb"] > 0
    assert result["summary"]["target"] == "s2s.llm.ctranslate2_lm.CTranslate2LM"


def test_answer_benchmark_command_asks_the_whole_set(tmp_path):
    from s2s.bench.answer_set import ANSWER_SET

    result = subprocess.run([sys.executable, "-m", "s2s.bench", "answers", "llm=echo"], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith(("[right ]", "[wrong ]", "[unsure]"))]
    assert len(lines) == len(ANSWER_SET) >= 100 and ANSWER_SET[0].ask in lines[0]
    assert re.search(r"right \d+ \(\d+%\), confidently wrong \d+ \(\d+%\), unsure \d+ \(\d+%\) of \d+; "
                     r"first 5 words median \d\.\d\d s", result.stdout)
    assert re.search(r"peak memory \d+(\.\d)? MiB", result.stdout)
    bad = subprocess.run([sys.executable, "-m", "s2s.bench", "answers", "llm=echo", "llm.prefix=1", "--nope"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2


def test_recognition_benchmark_scores_variants_in_turn(tmp_path):
    result = subprocess.run([sys.executable, "-m", "s2s.bench", "recognition", "runner.threads.stt=1", "--clips", "2",
                             "--versus", "stt.window_s=null"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ["runner.threads.stt=1", "runner.threads.stt=1 stt.window_s=null"]
    for row in rows:  # WER, on the real set (as written and normalised) and on espeak (none of either among the
        # first 2 clips), errors / words, clips with an error of 2, seconds per second of speech
        assert re.match(r"\| `[^`]+` \| \d\.\d{3} \| - \| - \| - \| \d+ / \d+ \| \d of 2 \| \d\.\d{3} / \d\.\d{3} \|",
                        row), row
        # the decode at the pause (stt.at_pause) comes after the end of speech: it is timed, not hidden
        assert float(row.split("|")[-2].split("/")[0]) > 0, row

"""The embedded default end to end on real packaged models: speech in, speech out, transcribed back."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile

from conftest import run_cli
from s2s import audio

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def whisper():
    from faster_whisper import WhisperModel

    from s2s.stt.faster_whisper import resolve_model

    model = WhisperModel(resolve_model("tiny.en"), device="cpu", compute_type="int8")

    def transcribe(path: Path) -> str:
        segments, _ = model.transcribe(str(path), language="en", beam_size=5)  # greedy int8 depends on the CPU
        return " ".join(segment.text.strip() for segment in segments)

    return transcribe


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def run_default(tmp_path: Path, speech: Path, *overrides: str):
    out = tmp_path / "run"
    result = run_cli(f"source.path={speech}", f"hydra.run.dir={out}", *overrides, cwd=tmp_path)
    return result, out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("overrides", [(), ("llm=ctranslate2", "stt.cpu_decoder=ctranslate2")],
                         ids=["default", "ctranslate2"])
def test_question_gets_a_spoken_answer(tmp_path, espeak, whisper, overrides):
    """The default (the LLM and Whisper's greedy decodes on onnxruntime, built on first use), and both on
    CTranslate2."""
    question = espeak("What is the capital of France?", tmp_path / "question.wav")
    result, out = run_default(tmp_path, question, *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    [turn] = read_jsonl(out / "transcript.jsonl")
    assert "capital" in words(turn["user"]) and turn["complete"]  # "France" is marginal for tiny.en int8 on some CPUs
    assert len(words(turn["assistant"])) >= 2
    heard = words(whisper(out / "reply.wav"))
    assert len(heard) >= 2, heard
    assert len(set(heard) & set(words(turn["assistant"]))) >= 2  # the reply audio says the reply text
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "completed"
    figures = metrics["turns"][0]["timings"]
    for name in ("voice_to_voice_s", "stt_s", "llm_first_token_s", "llm_first_sentence_s", "tts_first_audio_s",
                 "tts_rtf"):
        assert figures[name] is not None and figures[name] > 0, name
    assert figures["voice_to_voice_s"] >= figures["stt_s"]
    assert metrics["summary"]["median"]["voice_to_voice_s"] == figures["voice_to_voice_s"]


def test_two_turns_get_two_replies_in_order(tmp_path, espeak, whisper):
    first = audio.read_audio(espeak("Good morning to you.", tmp_path / "a.wav"), 16000)
    second = audio.read_audio(espeak("Please tell me a story.", tmp_path / "b.wav"), 16000)
    gap = audio.silence(1.2, 16000)
    path = tmp_path / "two.wav"
    soundfile.write(path, np.concatenate([gap, first, gap, second, gap]), 16000)
    result, out = run_default(tmp_path, path, "llm=echo")
    assert result.returncode == 0, result.stderr[-3000:]
    turns = read_jsonl(out / "transcript.jsonl")
    assert [t["turn"] for t in turns] == [0, 1]
    assert "morning" in words(turns[0]["user"]) and "story" in words(turns[1]["user"])
    heard = words(whisper(out / "reply.wav"))
    assert "morning" in heard and "story" in heard
    assert heard.index("morning") < heard.index("story")


def test_stereo_44k_float_input_works(tmp_path, espeak):
    mono = audio.read_audio(espeak("Hello, can you hear me?", tmp_path / "m.wav"), 44100)
    path = tmp_path / "stereo.wav"
    pad = audio.silence(0.5, 44100)
    signal = np.concatenate([pad, mono, pad])
    soundfile.write(path, np.stack([signal, 0.8 * signal], axis=1), 44100, subtype="FLOAT")
    result, out = run_default(tmp_path, path, "llm=echo")
    assert result.returncode == 0, result.stderr[-3000:]
    [turn] = read_jsonl(out / "transcript.jsonl")
    assert "hear" in words(turn["user"])
    assert soundfile.info(str(out / "reply.wav")).frames > 0


def test_silence_only_gives_no_reply_and_exit_0(tmp_path):
    path = tmp_path / "silence.wav"
    soundfile.write(path, np.zeros(16000 * 3, dtype=np.int16), 16000)
    result, out = run_default(tmp_path, path, "llm=echo")
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_jsonl(out / "transcript.jsonl") == []
    assert not (out / "reply.wav").exists()
    assert json.loads((out / "metrics.json").read_text())["summary"]["turns"] == 0

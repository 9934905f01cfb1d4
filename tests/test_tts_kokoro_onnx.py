"""The default TTS (Kokoro-82M int8 ONNX from its registry packages) through the real stage."""
from __future__ import annotations

import numpy as np
import pytest

from s2s.platform import machine_context
from s2s import audio
from s2s.messages import ReplyAudio, ReplyText
from s2s.tts.kokoro_onnx import KokoroOnnxTTS

pytestmark = pytest.mark.slow


HERE = machine_context("tts")  # settings changed in place are judged for this machine, as a session's are

@pytest.fixture(scope="module")
def kokoro(tmp_path_factory):
    stage = KokoroOnnxTTS(cache_dir=str(tmp_path_factory.mktemp("cache")))
    stage.setup()
    yield stage
    stage.close()


def test_reply_chunks_start_with_sound_and_end_after_a_short_pause(kokoro):
    raw = np.concatenate([audio.to_pipeline(block, kokoro.sample_rate)
                          for block in kokoro.synthesize("The capital of France is Paris.", None)])
    first, _ = audio.sound_bounds(raw)
    assert first > 0.15 * kokoro.sample_rate  # the model pads its speech with silence ...
    blocks = [m for m in kokoro.process(ReplyText("The capital of France is Paris.", 0)) if isinstance(m, ReplyAudio)]
    shaped = np.concatenate([block.samples for block in blocks])
    start, stop = audio.sound_bounds(shaped)
    assert start <= kokoro.lead_silence_s * kokoro.sample_rate + 1  # ... the stage lets sound start at once
    assert len(shaped) - stop <= kokoro.max_pause_s * kokoro.sample_rate + 1
    assert stop - start > 0.8 * kokoro.sample_rate and all(block.turn == 0 for block in blocks)  # speech kept


def test_clauses_are_synthesized_on_their_own(kokoro):
    text = "Well, the capital of France, as everyone knows, is Paris."
    assert len(list(kokoro.synthesize(text, None))) >= 2


def test_voice_and_speed_change_in_place_as_a_stage_built_with_them_and_nothing_reloads(kokoro, monkeypatch):
    import onnxruntime

    from spies import spy

    built = KokoroOnnxTTS(voice="jm_kumo", speed=1.3, cache_dir=kokoro.cache_dir)
    built.setup()
    expected = np.concatenate(list(built.synthesize("Good morning.", None)))
    built.close()
    loads = spy(monkeypatch, onnxruntime.InferenceSession, "__init__")
    configured = kokoro.settings()
    try:
        assert kokoro.apply_settings({"voice": "jm_kumo", "speed": 1.3}, HERE) is True
        assert np.array_equal(np.concatenate(list(kokoro.synthesize("Good morning.", None))), expected)
        assert loads == []
        with pytest.raises(ValueError, match="tts.voice=af_heart"):
            kokoro.apply_settings({"voice": "af_heart"}, HERE)
        assert kokoro.voice == "jm_kumo"
    finally:
        kokoro.apply_settings(configured, HERE)
    assert (kokoro.voice, kokoro.speed) == ("jf_alpha", 1.0)

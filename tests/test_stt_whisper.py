"""stt=whisper (transformers) on a tiny Whisper overfitted on two tones: transcripts, language detection,
resampling, wordless turns, validation before loading."""
from __future__ import annotations

import pytest

from conftest import CACHE, compose_config
from s2s import audio
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.messages import SpeechSegment, Transcript, TurnEnd
from s2s.stt.whisper import WhisperSTT
from tests.fixtures import tiny_whisper


@pytest.fixture(scope="module")
def whisper_dir():
    return tiny_whisper.cached(CACHE / "models")


def make(model, **options) -> WhisperSTT:
    stage = WhisperSTT(model=str(model), device="cpu", max_new_tokens=16, **options)
    stage.setup()
    stage.warm_up()
    return stage


def segment(frequency: float, rate: int = 16000, turn: int = 0) -> SpeechSegment:
    return SpeechSegment(tiny_whisper.tone(frequency, 1.5, rate), rate, turn, 0.0, 1.5)


def test_detection_gives_each_transcript_its_language(whisper_dir):
    stage = make(whisper_dir)
    assert list(stage.process(segment(220.0, turn=1))) == [Transcript("hello world", 1, "en")]
    assert list(stage.process(segment(880.0, rate=44100, turn=2))) == [Transcript("guten tag", 2, "de")]


def test_a_configured_language_is_forced(whisper_dir):
    stage = make(whisper_dir, language="de")
    [out] = list(stage.process(segment(880.0)))
    assert out.language == "de" and out.text == "guten tag"
    [out] = list(stage.process(segment(220.0)))
    assert out.language == "de"  # forced: no detection


def test_audio_without_words_ends_the_turn(whisper_dir):
    stage = make(whisper_dir)
    assert list(stage.process(SpeechSegment(audio.silence(1.0, 16000), 16000, 7, 0.0, 1.0))) == [TurnEnd(7)]


@pytest.mark.parametrize("override,fragment", [
    ("stt.language=english", "stt.language=english: invalid; expected one of"),
    ("stt.model=/no/such/whisper", "stt.model=/no/such/whisper: invalid; expected an existing local model folder"),
    ("stt.dtype=int4", "stt.dtype=int4: invalid; expected one of auto, float32, float16, bfloat16"),
])
def test_validation_names_key_value_and_what_is_valid(override, fragment, tmp_path):
    with pytest.raises(ConfigErrors, match=fragment):
        validate(compose_config(["stt=whisper", override], tmp_path))


def test_a_hub_id_passes_validation(tmp_path):
    specs = validate(compose_config(["stt=whisper", "stt.model=distil-whisper/distil-large-v3"], tmp_path))
    assert next(s for s in specs if s.group == "stt").kwargs["model"] == "distil-whisper/distil-large-v3"

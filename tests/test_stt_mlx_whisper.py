"""stt=mlx_whisper through mlx-whisper's own transcribe() on mlx[cpu] (Linux) with a tiny random MLX Whisper:
the model loads from a local folder, each utterance yields what the bare library hears, with a language;
the platform rule refuses it where MLX has no wheels."""
from __future__ import annotations

import pytest

from conftest import compose_config
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s import audio
from s2s.messages import SpeechSegment, Transcript, TurnEnd
from s2s.languages import WHISPER_LANGUAGES
from s2s.text import has_words
from s2s.stt.mlx_whisper import MLXWhisperSTT
from tests.fixtures import tiny_mlx_whisper, tiny_whisper

pytest.importorskip("mlx_whisper")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_mlx_whisper.build(tmp_path_factory.mktemp("mlx_whisper") / "tiny")


@pytest.mark.parametrize("language", [None, "de"])
def test_each_utterance_is_transcribed_with_a_language_as_the_bare_library_hears_it(model_dir, language):
    stage = MLXWhisperSTT(model=str(model_dir), dtype="float32", language=language)
    stage.setup()
    stage.warm_up()
    samples = tiny_whisper.tone(220.0, 1.0, 8000)
    text, heard_in = stage.recognise(audio.resample(samples, 8000, 16000))
    # what the bare library hears in the same audio (random weights decode a token or two): the stage must
    # give exactly that, so an always-empty transcription fails
    import mlx_whisper

    bare = mlx_whisper.transcribe(audio.resample(samples, 8000, 16000), path_or_hf_repo=str(model_dir),
                                  language=language, temperature=0.0, condition_on_previous_text=False,
                                  fp16=False, verbose=None)
    assert bare["text"].strip(), "the tiny model decodes some text from this tone"
    assert text == bare["text"].strip()
    assert heard_in == (language or bare["language"]) and heard_in in WHISPER_LANGUAGES
    # the turn: random weights decode marks alone ("!"), which are no words, so it ends with no reply
    [out] = list(stage.process(SpeechSegment(samples, 8000, 6, 0.0, 1.0)))
    assert out == (Transcript(text, 6, heard_in) if has_words(text) else TurnEnd(6))
    stage.close()


def test_mlx_whisper_is_refused_where_mlx_has_no_wheels(tmp_path):
    with pytest.raises(ConfigErrors, match=r"stt=mlx_whisper: invalid; expected another option on platform "
                                           r"macos_intel \(MLX publishes no wheels for Intel Macs\)"):
        validate(compose_config(["stt=mlx_whisper", "platform=macos_intel"], tmp_path))
    with pytest.raises(ConfigErrors, match="stt.language=zz: invalid; expected one of"):
        validate(compose_config(["stt=mlx_whisper", "stt.language=zz"], tmp_path))
    with pytest.raises(ConfigErrors, match="stt.model=/no/such/folder: invalid; expected an existing local"):
        validate(compose_config(["stt=mlx_whisper", "stt.model=/no/such/folder"], tmp_path))

"""stt=parakeet through onnx-asr (its preprocessor, encoder call and TDT decoding loop) on a tiny ONNX model
that always says "hello", and through parakeet-mlx on mlx[cpu] with a tiny random model; with language=null, each
turn's language detected from its text (lingua) and kept over a text too short to tell; platform rules
(Apple silicon -> mlx) and validation before loading."""
from __future__ import annotations

import pytest

from conftest import compose_config
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.messages import SpeechSegment, Transcript, TurnEnd
from s2s.stt.parakeet import ParakeetSTT
from tests.fixtures import tiny_parakeet, tiny_whisper


def segment(rate: int = 16000, turn: int = 0, seconds: float = 1.0) -> SpeechSegment:
    return SpeechSegment(tiny_whisper.tone(220.0, seconds, rate), rate, turn, 0.0, seconds)


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    pytest.importorskip("onnx_asr")
    return tiny_parakeet.build_onnx(tmp_path_factory.mktemp("parakeet") / "onnx")


def test_onnx_asr_transcribes_each_utterance(onnx_dir):
    stage = ParakeetSTT(model=str(onnx_dir), backend="onnx", language="en")
    stage.setup()
    stage.warm_up()
    assert list(stage.process(segment(turn=2))) == [Transcript(tiny_parakeet.SAID, 2, "en")]
    assert list(stage.process(segment(rate=44100, turn=3))) == [Transcript("hello", 3, "en")]  # resampled first
    stage.language = None
    assert list(stage.process(segment(turn=4))) == [Transcript("hello", 4, None)]
    stage.close()


# the tiny model says one word per encoder frame (80 ms): a tenth of a second is "Ja, gerne.", a second all of it
GERMAN = "Ja, gerne. Ich möchte heute Abend einen Tisch für zwei Personen reservieren."


@pytest.fixture(scope="module")
def detecting(tmp_path_factory):
    pytest.importorskip("onnx_asr")
    pytest.importorskip("lingua")
    folder = tiny_parakeet.build_onnx(tmp_path_factory.mktemp("parakeet") / "german", said=GERMAN)
    stage = ParakeetSTT(model=str(folder), backend="onnx", language=None)
    stage.setup()
    stage.warm_up()  # the warm-up's silence says the whole sentence too: it must leave no language behind
    yield stage
    stage.close()


def test_language_null_detects_each_turn_and_a_short_text_keeps_the_last(detecting):
    def heard(turn, seconds, language=None):
        samples = tiny_whisper.tone(220.0, seconds, 16000)
        [out] = list(detecting.process(SpeechSegment(samples, 16000, turn, 0.0, seconds, language=language)))
        return out.text, out.language

    detecting.reset()
    assert heard(1, 0.1) == ("Ja, gerne.", None)  # too short to name a language, and none was detected before
    assert heard(2, 1.0) == (GERMAN, "de")
    assert heard(3, 0.1) == ("Ja, gerne.", "de")  # kept
    assert heard(4, 1.0, language="it") == (GERMAN, "it")  # the session's language is the label; nothing detected
    assert heard(5, 0.1) == ("Ja, gerne.", "de")
    detecting.reset()  # a new conversation (a pooled pipeline released) starts with no language
    assert heard(6, 0.1) == ("Ja, gerne.", None)


def test_mlx_backend_runs_parakeet_mlx(tmp_path):
    pytest.importorskip("parakeet_mlx")
    stage = ParakeetSTT(model=str(tiny_parakeet.build_mlx(tmp_path / "mlx")), backend="mlx", language="de")
    stage.setup()
    stage.warm_up()
    [out] = list(stage.process(segment(rate=8000, turn=5)))
    if isinstance(out, Transcript):  # random weights: some tokens of its vocabulary, or none
        assert out.turn == 5 and out.language == "de"
        assert set(out.text.replace(" ", "")) <= set("helowrd")
    else:
        assert out == TurnEnd(5)
    stage.close()


def test_apple_silicon_picks_mlx_and_the_command_line_wins(tmp_path):
    def stt(overrides):
        return next(s for s in validate(compose_config(["stt=parakeet", *overrides], tmp_path)) if s.group == "stt")

    assert stt(["platform=macos"]).kwargs["backend"] == "mlx"
    assert stt(["platform=macos", "stt.backend=onnx"]).kwargs["backend"] == "onnx"
    assert stt(["platform=linux"]).kwargs["backend"] == "onnx"
    assert stt(["platform=macos_intel"]).kwargs["backend"] == "onnx"
    spec = stt(["platform=macos"])
    assert spec.build().describe()["model"] == "mlx-community/parakeet-tdt-0.6b-v2"
    assert stt(["platform=linux"]).build().describe()["model"] == "nemo-parakeet-tdt-0.6b-v2"


@pytest.mark.parametrize("overrides,fragment", [
    (["stt.backend=mlx", "platform=macos_intel"],
     r"stt.backend=mlx: invalid; expected onnx on platform macos_intel \(MLX publishes no wheels"),
    (["stt.backend=torch"], "stt.backend=torch: invalid; expected one of onnx, mlx"),
    (["stt.quantization=int8", "platform=macos"], "stt.quantization=int8: invalid; expected null with backend=mlx"),
    (["stt.model=/no/such/parakeet"], "stt.model=/no/such/parakeet: invalid; expected an existing local model folder"),
    (["stt.language=english"], "stt.language=english: invalid; expected one of"),
])
def test_validation_names_key_value_and_what_is_valid(overrides, fragment, tmp_path):
    with pytest.raises(ConfigErrors, match=fragment):
        validate(compose_config(["stt=parakeet", *overrides], tmp_path))


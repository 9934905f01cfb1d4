"""stt=parakeet through onnx-asr (its preprocessor, encoder call and TDT decoding loop) on a tiny ONNX model
that always says "hello", and through parakeet-mlx on mlx[cpu] with a tiny random model; platform rules
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
    pytest.importorskip("onnx")
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


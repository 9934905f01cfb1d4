"""stt=sense_voice and stt=paraformer through funasr's own AutoModel, on tiny models built from funasr's classes
(tests/fixtures/tiny_funasr.py) and taught to hear the packaged sample question; validation before any load."""
from __future__ import annotations

import os

import numpy as np
import pytest
import soundfile

from conftest import ROOT, compose_config
from s2s import audio
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.messages import SpeechSegment, Transcript
from s2s.stage import MissingExtraError
from s2s.stt.funasr_models import ParaformerSTT, SenseVoiceSTT, _auto_model, split_tags
from tests.fixtures import tiny_funasr

QUESTION = ROOT / "s2s" / "samples" / "question.wav"


def segment(samples: np.ndarray, rate: int = 16000, turn: int = 0, language: str | None = None) -> SpeechSegment:
    return SpeechSegment(samples, rate, turn, 0.0, len(samples) / rate, language=language)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The question (16 kHz), and the two tiny models that hear it; funasr imported the way the stages do."""
    before = os.environ.get("HYDRA_FULL_ERROR")
    try:
        _auto_model("stt=sense_voice", "sense-voice")  # the stages' import: torchaudio repaired first
    except MissingExtraError as error:
        pytest.skip(str(error))
    samples, rate = soundfile.read(QUESTION, dtype="float32")
    assert rate == 16000
    folder = tmp_path_factory.mktemp("funasr")
    return {"samples": samples, "hydra_full_error": (before, os.environ.get("HYDRA_FULL_ERROR")),
            "sense_voice": tiny_funasr.build_sense_voice(folder / "sense_voice", samples),
            "paraformer": tiny_funasr.build_paraformer(folder / "paraformer", samples)}


def test_sense_voice_strips_its_tags_and_carries_the_language_it_identified(models):
    samples = models["samples"]
    stage = SenseVoiceSTT(model=str(models["sense_voice"]), device="cpu")
    stage.setup()
    stage.warm_up()
    raw = stage._model.generate(samples, cache={}, language="auto", use_itn=True)[0]["text"]
    assert split_tags(raw) == (tiny_funasr.SENSE_SAID, ["en", "NEUTRAL", "Speech", "withitn"])  # the real decode
    assert raw.startswith("<|en|><|NEUTRAL|>")
    said = tiny_funasr.SENSE_SAID
    assert list(stage.process(segment(samples, turn=1))) == [Transcript(said, 1, "en")]
    # a 48 kHz segment is resampled first; a session's language SenseVoice knows is told to it ("en"), and one
    # it does not know (fr) is identified instead
    louder = audio.resample(samples, 16000, 48000)
    assert list(stage.process(segment(louder, 48000, turn=2, language="en"))) == [Transcript(said, 2, "en")]
    assert list(stage.process(segment(samples, turn=3, language="fr"))) == [Transcript(said, 3, "en")]
    assert stage.language is None  # the session's language was for that call only
    stage.close()


def test_paraformer_transcribes_with_the_configured_language_label(models):
    stage = ParaformerSTT(model=str(models["paraformer"]), device="cpu", language="zh")
    stage.setup()
    stage.warm_up()
    said = tiny_funasr.PARAFORMER_SAID
    assert list(stage.process(segment(models["samples"], turn=4))) == [Transcript(said, 4, "zh")]
    stage.language = None  # a local folder's language is unknown; FunASR's names say theirs
    assert list(stage.process(segment(models["samples"], turn=5))) == [Transcript(said, 5, None)]
    stage.close()


def test_importing_funasr_leaves_hydra_full_error_as_it_was(models):
    before, after = models["hydra_full_error"]
    assert after == before  # funasr's import sets it to 1 for the whole process; the stage puts it back


def test_split_tags_removes_every_tag_wherever_it_is():
    assert split_tags("<|zh|><|HAPPY|><|BGM|><|woitn|>你好 <|en|>hello") == ("你好 hello",
                                                                          ["zh", "HAPPY", "BGM", "woitn", "en"])
    assert split_tags("no tags") == ("no tags", [])


def test_published_names_describe_their_source_and_language(tmp_path):
    def stt(option, *overrides):
        return next(s for s in validate(compose_config([f"stt={option}", *overrides], tmp_path)) if s.group == "stt")

    assert stt("sense_voice").build().describe() == {"model": "FunAudioLLM/SenseVoiceSmall (hf)", "device": "cpu",
                                                     "language": "detect"}
    assert stt("paraformer").build().describe()["language"] == "zh"
    assert stt("paraformer", "stt.model=paraformer-en", "stt.hub=ms").build().describe() == {
        "model": "paraformer-en (ms)", "device": "cpu", "language": "en"}
    assert stt("sense_voice", "platform=linux_cuda").kwargs["device"] == "cuda"


@pytest.mark.parametrize("option,overrides,fragment", [
    ("sense_voice", ["stt.language=fr"], r"stt.language=fr: invalid; expected one of zh, en, yue, ja, ko"),
    ("sense_voice", ["stt.hub=modelscope"], r"stt.hub=modelscope: invalid; expected one of hf, ms"),
    ("sense_voice", ["stt.model=/no/such/sensevoice"],
     r"stt.model=/no/such/sensevoice: invalid; expected an existing local model folder or a hub id such as "
     r"FunAudioLLM/SenseVoiceSmall"),
    ("paraformer", ["stt.language=klingon"], r"stt.language=klingon: invalid; expected one of"),
    ("paraformer", ["stt.device=tpu"], r"stt.device=tpu: invalid"),
    ("paraformer", ["+stt.use_itn=true"],
     r"stt.use_itn=True: invalid; expected a known key; .*ParaformerSTT takes: model, hub, device, language"),
])
def test_bad_config_is_refused_before_loading(option, overrides, fragment, tmp_path):
    with pytest.raises(ConfigErrors, match=fragment):
        validate(compose_config([f"stt={option}", *overrides], tmp_path))


def test_a_folder_without_the_checkpoint_is_refused_naming_what_is_missing(tmp_path):
    (tmp_path / "config.yaml").write_text("model: Paraformer\n")
    with pytest.raises(ConfigErrors, match=r"stt.model=.*: invalid; expected a model folder with config.yaml and "
                                           r"model.pt \(it has no model.pt\) or a hub id such as paraformer-zh"):
        validate(compose_config(["stt=paraformer", f"stt.model={tmp_path}"], tmp_path))


def test_a_hub_model_missing_offline_is_one_clear_error(models):
    stage = ParaformerSTT(model="funasr/no-such-paraformer", device="cpu")  # HF_HUB_OFFLINE=1 (conftest)
    with pytest.raises(RuntimeError, match=r"^stt=paraformer: funasr/no-such-paraformer is not in the local cache "
                                           r"of hub hf and could not be downloaded \(offline\?\)"):
        stage.setup()

"""tts=mms on tiny random-weight VITS models loaded through transformers' VitsModel.from_pretrained."""
from __future__ import annotations

import logging
import re

import numpy as np
import pytest

from s2s.config import validate
from s2s.platform import machine_context
from s2s.config_errors import ConfigErrors
from s2s.messages import ReplyAudio, ReplyText
from s2s.tts.mms import LANGUAGES, MmsTTS, split_for_speech
from spies import spy
from tests.conftest import compose_config
from tests.fixtures import mms as tiny

EN_RATE, FR_RATE = 16000, 22050  # the two tiny "languages" differ in rate, so a switch shows in the output


@pytest.fixture(scope="session")
def voices(tmp_path_factory):
    root = tmp_path_factory.mktemp("mms")
    return {"en": tiny.build(root / "mms-tts-eng", seed=0, sampling_rate=EN_RATE),
            "fr": tiny.build(root / "mms-tts-fra", seed=1, sampling_rate=FR_RATE, language="fra")}


@pytest.fixture(scope="session")
def transformers():
    from s2s import torch_support

    torch_support.repair_torchaudio()
    import transformers

    return transformers


def make_stage(voices, **options) -> MmsTTS:
    return MmsTTS(**{"language": "en", "model": str(voices["en"]), "models": {"fr": str(voices["fr"])},
                     "device": "cpu", **options})


def test_one_finite_block_per_sentence_at_the_model_rate(voices, transformers, monkeypatch):
    forwards = spy(monkeypatch, transformers.VitsModel, "forward")
    stage = make_stage(voices)
    stage.setup()
    out = list(stage.process(ReplyText("Hello world. This is a test, of a tiny voice!", turn=2)))

    assert len(out) == 2 and len(forwards) == 2 and all(isinstance(message, ReplyAudio) for message in out)
    assert {message.sample_rate for message in out} == {EN_RATE} and stage.sample_rate == EN_RATE
    for message in out:
        assert message.samples.dtype == np.float32 and message.samples.ndim == 1
        assert len(message.samples) > 0 and np.isfinite(message.samples).all()


def test_a_turn_in_another_language_loads_its_model_once(voices, transformers, monkeypatch):
    loads = spy(monkeypatch, transformers.VitsModel, "from_pretrained")
    stage = make_stage(voices)
    stage.setup()
    assert [call.args[0] for call in loads] == [str(voices["en"])]

    french = list(stage.process(ReplyText("bonjour le monde.", turn=0, language="fr")))
    assert french and {message.sample_rate for message in french} == {FR_RATE}
    list(stage.process(ReplyText("encore une fois.", turn=1, language="fr")))
    english = list(stage.process(ReplyText("back to english.", turn=2, language="en")))
    assert {message.sample_rate for message in english} == {EN_RATE}
    unset = list(stage.process(ReplyText("no language given.", turn=3, language=None)))
    assert {message.sample_rate for message in unset} == {EN_RATE}
    assert [call.args[0] for call in loads] == [str(voices["en"]), str(voices["fr"])]  # cached per model


def test_a_language_without_a_model_falls_back_with_one_warning(voices, transformers, caplog):
    stage = make_stage(voices)
    stage.setup()
    with caplog.at_level(logging.WARNING, logger="s2s.tts.mms"):
        for turn in range(2):
            out = list(stage.process(ReplyText("still speaking.", turn=turn, language="xx")))
            assert out and {message.sample_rate for message in out} == {EN_RATE}
        # "de" is in the built-in map, but facebook/mms-tts-deu is neither cached nor reachable offline
        out = list(stage.process(ReplyText("still speaking.", turn=3, language="de")))
        assert out and {message.sample_rate for message in out} == {EN_RATE}
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2
    assert "'xx'" in warnings[0] and "tts.models" in warnings[0] and "'en' model" in warnings[0]
    assert "'de'" in warnings[1] and "facebook/mms-tts-deu" in warnings[1]


def test_speaking_rate_and_noise_scale_reach_the_model(voices, transformers):
    import torch

    lengths = {}
    for rate in (1.0, 2.0):
        stage = make_stage(voices, speaking_rate=rate, noise_scale=0.0)
        stage.setup()
        model = stage._loaded[str(voices["en"])][0]
        assert (model.speaking_rate, model.config.noise_scale) == (rate, 0.0)  # what its forward reads
        torch.manual_seed(0)  # same duration noise for both rates
        lengths[rate] = sum(len(m.samples) for m in stage.process(ReplyText("a rather long sentence here.", 0)))
    assert lengths[2.0] < 0.75 * lengths[1.0]
    assert stage.apply_settings({"speaking_rate": None}, machine_context("tts")) and model.speaking_rate == model.config.speaking_rate
    assert stage.apply_settings({"speaking_rate": 1.0}, machine_context("tts")) and model.speaking_rate == 1.0  # in place: no reload
    torch.manual_seed(0)
    assert sum(len(m.samples) for m in stage.process(ReplyText("a rather long sentence here.", 0))) == lengths[1.0]


def test_closing_after_the_first_block_stops_synthesis(voices, transformers, monkeypatch):
    forwards = spy(monkeypatch, transformers.VitsModel, "forward")
    stage = make_stage(voices)
    stage.setup()
    replies = stage.process(ReplyText("One sentence here. Another one here. And a third one.", turn=0))
    assert isinstance(next(replies), ReplyAudio)
    replies.close()
    assert len(forwards) == 1


def test_text_it_cannot_say_yields_nothing(voices, transformers):
    stage = make_stage(voices)
    stage.setup()
    assert list(stage.process(ReplyText("123 !!!", turn=0))) == []


def test_long_sentences_are_cut_at_clauses():
    sentence = ", ".join(["a clause of about thirty characters"] * 10) + "."
    pieces = split_for_speech(f"Short one. {sentence}")
    assert pieces[0] == "Short one." and len(pieces) > 2
    assert all(len(piece) <= 160 for piece in pieces) and " ".join(pieces[1:]) == sentence


def test_language_map_matches_whisper_codes():
    assert len(LANGUAGES) == 38
    assert (LANGUAGES["kn"], LANGUAGES["ms"], LANGUAGES["tl"], LANGUAGES["hy"]) == ("kan", "zlm", "tgl", "hyw")
    assert MmsTTS(language="fr").model_for("fr") == "facebook/mms-tts-fra"


@pytest.mark.parametrize(("overrides", "fragment"), [
    (["tts.language=zz"], "tts.language=zz: invalid; expected a code with an MMS model: ar, az, bg"),
    (["tts.language=fr", "tts.model=facebook/mms-tts-fra", "tts.models={fr: /x}"],
     "tts.model=facebook/mms-tts-fra: invalid; expected null when models.fr is set"),
    (["tts.models={fr: /no/such/mms}"], "tts.models.fr=/no/such/mms: invalid; expected an existing local model folder"),
    (["tts.speaking_rate=0"], "tts.speaking_rate=0: invalid; expected a number from 0.25 to 4"),
])
def test_validation_names_key_value_and_what_is_valid(overrides, fragment):
    with pytest.raises(ConfigErrors, match=re.escape(fragment)):
        validate(compose_config(["tts=mms", *overrides]))


def test_models_can_add_a_language_beyond_the_built_in_list(voices):
    specs = validate(compose_config(["tts=mms", "tts.language=yo", f"tts.models={{yo: {voices['en']}}}"]))
    assert specs[-2].kwargs["language"] == "yo" and specs[-2].build().model_for("yo") == str(voices["en"])

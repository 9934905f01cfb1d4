"""tts=supertonic: the ``supertonic`` package's real loader and engine on a tiny model folder in its layout."""
from __future__ import annotations

import inspect
import json
import logging
import re
import shutil
import tomllib
from importlib import metadata

import numpy as np
import pytest
import soundfile
import supertonic
from packaging.requirements import Requirement

from graph_stages import CountingSource, Recognizer, Segmenter, Talker
from s2s.platform import machine_context
from s2s import sharing
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.graph import Graph
from s2s.io.file import FileSink
from s2s.messages import ReplyAudio, ReplyText
from s2s.tts import supertonic as backend
from s2s.tts.supertonic import SupertonicTTS
from spies import spy
from tests.conftest import CACHE, ROOT, compose_config, run_cli
from tests.fixtures import supertonic as tiny

HERE = machine_context("tts")  # settings changed in place are judged for this machine, as a session's are

EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
# The reference system's list (huggingface/speech-to-speech, TTS/supertonic_tts_handler.py)
REFERENCE_LANGUAGES = {"ar", "bg", "cs", "da", "de", "el", "en", "es", "et", "fi", "fr", "hi", "hr", "hu", "id", "it",
                       "ja", "ko", "lt", "lv", "na", "nl", "pl", "pt", "ro", "ru", "sk", "sl", "sv", "tr", "uk", "vi"}


@pytest.fixture(scope="session")
def folder():
    return tiny.cached(CACHE / "models")


@pytest.fixture(scope="session")
def onnxruntime():
    import onnxruntime

    return onnxruntime


def make_stage(folder, **options) -> SupertonicTTS:
    stage = SupertonicTTS(model=str(folder), **options)
    stage.setup()
    return stage


def feeds(calls, graph: str) -> list[dict]:
    """The input feeds given to one of the four graphs, told apart by an input only it takes."""
    own = {"duration_predictor": "style_dp", "vector_estimator": "noisy_latent", "vocoder": "latent"}
    return [call.args[2] for call in calls if own[graph] in call.args[2]]


def spoken(feed: dict) -> str:
    """The text a ``text_ids`` row spells (the tiny indexer's id is the code point)."""
    return "".join(map(chr, feed["text_ids"][0]))


def expected_samples(tagged: str, voice: str = "M1", speed: float = 1.0) -> float:
    """What the tiny duration model predicts for the tagged text, in samples."""
    seconds = len(tagged) * tiny.SECONDS_PER_CHARACTER * (1 + tiny.voice_dp_mean(voice)) / speed
    return seconds * tiny.SAMPLE_RATE


def test_sentences_come_out_one_by_one_at_44_1_khz_as_long_as_the_duration_model_says(folder, onnxruntime,
                                                                                        monkeypatch):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    stage = make_stage(folder, language="en")
    blocks = stage.synthesize("Hello there. How are you today?", None)
    first = next(blocks)
    assert len(feeds(runs, "vocoder")) == 1  # the first sentence's audio is out before the second is made
    rest = list(blocks)
    assert [spoken(feed) for feed in feeds(runs, "duration_predictor")] == [
        "<en>Hello there.</en>", "<en>How are you today?</en>"]
    for block, text in zip([first, *rest], ["<en>Hello there.</en>", "<en>How are you today?</en>"], strict=True):
        assert block.dtype == np.float32 and block.ndim == 1
        assert abs(len(block) - expected_samples(text)) <= 2  # cut where the predicted duration ends
    [vocoded] = feeds(runs, "vocoder")[:1]
    assert vocoded["latent"].shape[2] * tiny.FRAME > len(first)  # the vocoder's padding is not played

    out = list(stage.process(ReplyText("Hello there. How are you today?", turn=3)))
    assert stage.sample_rate == tiny.SAMPLE_RATE == 44100
    assert out and all(isinstance(m, ReplyAudio) and m.sample_rate == 44100 and m.turn == 3 for m in out)
    samples = np.concatenate([m.samples for m in out])
    assert samples.dtype == np.float32 and np.isfinite(samples).all() and 0.05 < np.abs(samples).max() <= 1


def test_the_voice_is_the_style_json_fed_to_the_graphs(folder, onnxruntime, monkeypatch):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    heard = {voice: np.concatenate(list(make_stage(folder, voice=voice).synthesize("Good morning.", None)))
             for voice in ("M1", "F5")}
    for feed, voice in zip(feeds(runs, "duration_predictor"), ("M1", "F5"), strict=True):
        style = json.loads((folder / "voice_styles" / f"{voice}.json").read_text())
        assert np.array_equal(feed["style_dp"], np.array(style["style_dp"]["data"], np.float32))
    for feed, voice in zip(feeds(runs, "vector_estimator")[::8], ("M1", "F5"), strict=True):
        style = json.loads((folder / "voice_styles" / f"{voice}.json").read_text())
        assert np.array_equal(feed["style_ttl"], np.array(style["style_ttl"]["data"], np.float32))
    assert abs(len(heard["F5"]) - expected_samples("<na>Good morning.</na>", "F5")) <= 2
    assert len(heard["F5"]) > 1.3 * len(heard["M1"])  # F5's duration style is slower in the tiny model


def test_speed_divides_the_duration(folder):
    text = "The capital of France is Paris."
    lengths = {speed: sum(len(block) for block in make_stage(folder, speed=speed).synthesize(text, None))
               for speed in (0.7, 1.0, 2.0)}
    for speed, length in lengths.items():
        assert abs(length - expected_samples(f"<na>{text}</na>", speed=speed)) <= 2
    assert lengths[0.7] > lengths[1.0] > lengths[2.0]


@pytest.mark.parametrize("steps", [1, 3, 12])
def test_total_steps_is_the_number_of_vector_estimator_runs(folder, onnxruntime, monkeypatch, steps):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    list(make_stage(folder, total_steps=steps).synthesize("One. Two.", None))
    estimated = feeds(runs, "vector_estimator")
    assert len(estimated) == 2 * steps  # per sentence
    assert [feed["current_step"].tolist() for feed in estimated] == [[float(step)] for step in range(steps)] * 2
    assert all(feed["total_step"].tolist() == [float(steps)] for feed in estimated)


def test_the_turn_language_or_the_configured_one_tags_the_text(folder, onnxruntime, monkeypatch, caplog):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    stage = make_stage(folder, language="fr")
    with caplog.at_level(logging.WARNING):
        for turn_language in (None, "de", "pt-BR", "en_US", "zh", "zh"):
            list(stage.synthesize("Bonjour.", turn_language))
    tags = [re.match(r"<(\w+)>", spoken(feed)).group(1) for feed in feeds(runs, "duration_predictor")]
    assert tags == ["fr", "de", "pt", "en", "fr", "fr"]  # zh: Supertonic has none, so the configured language
    assert [r.getMessage() for r in caplog.records if "no language" in r.getMessage()] == [
        "tts=supertonic has no language 'zh'; such turns are spoken with language=fr"]  # warned once
    list(make_stage(folder).synthesize("Hola.", None))
    assert spoken(feeds(runs, "duration_predictor")[-1]) == "<na>Hola.</na>"  # the default: language-agnostic


def test_characters_the_model_lacks_are_left_out_with_one_warning(folder, onnxruntime, monkeypatch, caplog):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    stage = make_stage(folder, language="en")
    with caplog.at_level(logging.WARNING):
        blocks = list(stage.synthesize("It costs 5€ ~ more or less. Café 漢 again €.", None))
    assert len(blocks) == 2
    texts = [spoken(feed) for feed in feeds(runs, "duration_predictor")]
    assert texts == ["<en>It costs 5 more or less.</en>", "<en>Cafe\u0301 again.</en>"]  # the package's NFKD
    warnings = [r.getMessage() for r in caplog.records if "no characters" in r.getMessage()]
    assert len(warnings) == 2 and all(c in warnings[0] for c in "€~") and "漢" in warnings[1]
    assert list(stage.synthesize("€ ~ ...", None)) == []  # nothing left to say: no model call


def test_voice_speed_steps_and_language_change_in_place_as_a_stage_built_with_them(folder, onnxruntime,
                                                                                   monkeypatch):
    changes = {"voice": "F2", "speed": 1.4, "total_steps": 3, "language": "es"}
    expected = np.concatenate(list(make_stage(folder, **changes).synthesize("Buenos días.", None)))
    stage = make_stage(folder)
    loads = spy(monkeypatch, onnxruntime.InferenceSession, "__init__")
    assert stage.apply_settings(changes, HERE) is True
    assert np.array_equal(np.concatenate(list(stage.synthesize("Buenos días.", None))), expected)
    assert loads == [] and stage.settings() == changes
    for bad, message in (({"voice": "alloy"}, "tts.voice=alloy: invalid; expected one of M1, M2"),
                         ({"speed": 2.5}, "tts.speed=2.5: invalid; expected a number from 0.7 to 2"),
                         ({"total_steps": 0}, "tts.total_steps=0: invalid; expected a number from 1 to 100"),
                         ({"language": "zh"}, "tts.language=zh: invalid; expected one of en, ko, ja")):
        with pytest.raises(ConfigErrors, match=re.escape(message)):
            stage.apply_settings(bad, HERE)
    assert stage.settings() == changes  # nothing changed
    assert stage.apply_settings({"model": None}, HERE) is False  # another model is another stage


def test_the_thread_budget_reaches_the_four_sessions_and_sharing_loads_them_once(folder):
    stage = SupertonicTTS(model=str(folder))
    stage.threads = 2
    stage.setup()
    engine = stage._engine
    sessions = [engine.dp_ort, engine.text_enc_ort, engine.vector_est_ort, engine.vocoder_ort]
    assert [s.get_session_options().intra_op_num_threads for s in sessions] == [2, 2, 2, 2]
    sharing.enable()
    try:
        first, second = make_stage(folder), make_stage(folder, voice="F1")
        assert first._engine.vocoder_ort is second._engine.vocoder_ort and sharing.shared_count() == 4
    finally:
        sharing.enable(False)


def test_offline_without_the_weights_says_where_they_come_from_and_downloads_nothing(tmp_path, monkeypatch):
    downloads = spy(monkeypatch, supertonic.loader, "download_model")
    stage = SupertonicTTS(cache_dir=str(tmp_path))
    with pytest.raises(RuntimeError) as caught:
        stage.setup()
    message = str(caught.value)
    revision = supertonic.config.get_model_revision("supertonic-3")[:12]
    assert str(tmp_path / "supertonic" / f"supertonic-3-{revision}") in message and "HF_HUB_OFFLINE=1" in message
    assert "Supertone/supertonic-3" in message and "tts.model" in message
    assert downloads == [] and not (tmp_path / "supertonic").exists()


def errors_of(overrides) -> list[str]:
    with pytest.raises(ConfigErrors) as caught:
        validate(compose_config(["tts=supertonic", *overrides]))
    return [str(error) for error in caught.value.errors]


def test_bad_voices_languages_speeds_steps_and_folders_fail_validation_naming_the_key(folder, tmp_path):
    voices, languages = ", ".join(backend.VOICES), ", ".join(backend.LANGUAGES)
    broken = tmp_path / "broken"
    (broken / "onnx").mkdir(parents=True)
    for name in ("tts.json", "unicode_indexer.json", "duration_predictor.onnx"):
        (broken / "onnx" / name).write_bytes((folder / "onnx" / name).read_bytes())
    cases = [
        (["tts.voice=M6"], f"tts.voice=M6: invalid; expected one of {voices}"),
        (["tts.language=zh"], f"tts.language=zh: invalid; expected one of {languages}"),
        (["tts.speed=0.5"], "tts.speed=0.5: invalid; expected a number from 0.7 to 2 (inclusive)"),
        (["tts.speed=2.1"], "tts.speed=2.1: invalid; expected a number from 0.7 to 2 (inclusive)"),
        (["tts.total_steps=0"], "tts.total_steps=0: invalid; expected a number from 1 to 100 (inclusive)"),
        (["tts.total_steps=2.5"], "tts.total_steps=2.5: invalid; expected an integer"),
        ([f"tts.model={tmp_path}/none"], f"tts.model={tmp_path}/none: invalid; expected null (Supertonic-3, "
                                         "downloaded once) or a Supertonic model folder (onnx/duration_predictor"),
        ([f"tts.model={broken}"], f"tts.model={broken}: invalid; expected a Supertonic model folder "),
    ]
    for overrides, message in cases:
        messages = errors_of(overrides)
        assert len(messages) == 1 and messages[0].startswith(message), (overrides, messages)
    [message] = errors_of([f"tts.model={broken}"])
    assert message.endswith("it has no onnx/text_encoder.onnx, onnx/vector_estimator.onnx, onnx/vocoder.onnx")
    fewer = shutil.copytree(folder, tmp_path / "fewer")
    (fewer / "voice_styles" / "M1.json").unlink()
    assert errors_of([f"tts.model={fewer}"]) == [f"tts.voice=M1: invalid; expected a voice of voice_styles/ in "
                                                 f"{fewer}: F1, F2, F3, F4, F5, M2, M3, M4, M5"]
    for good in ([], [f"tts.model={folder}", "tts.voice=F5", "tts.language=ko", "tts.speed=2", "tts.total_steps=12"]):
        validate(compose_config(["tts=supertonic", *good]))


def test_every_bad_value_is_reported_at_once_before_anything_loads(tmp_path):
    result = run_cli("tts=supertonic", "tts.voice=nobody", "tts.language=xx", "tts.speed=3", "tts.total_steps=0",
                     "dry_run=true", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    for key in ("tts.voice=nobody", "tts.language=xx", "tts.speed=3", "tts.total_steps=0"):
        assert f"{key}: invalid; expected" in result.stderr


def test_the_backend_speaks_through_the_real_runner_and_the_sink_resamples(folder, tmp_path):
    sink = FileSink(str(tmp_path / "reply.wav"), sample_rate=16000, turn_gap_ms=300)
    stage = SupertonicTTS(model=str(folder), language="en", speed=1.25)
    graph = Graph([("source", CountingSource(turns=2)), ("vad", Segmenter()), ("stt", Recognizer()),
                   ("llm", Talker(words=2)), ("tts", stage), ("sink", sink)])
    graph.setup()
    try:
        assert graph.run().status == "completed"
    finally:
        graph.close()
    samples, rate = soundfile.read(str(tmp_path / "reply.wav"), dtype="float32")
    sentences = [f"<en>turn {turn} word {word}.</en>" for turn in range(2) for word in range(2)]
    seconds = sum(expected_samples(text, speed=1.25) for text in sentences) / tiny.SAMPLE_RATE + 0.3
    assert rate == 16000 and abs(len(samples) / rate - seconds) < 0.01 and np.abs(samples).max() > 0.05


def test_the_layout_languages_and_bounds_are_the_packages_own():
    config = supertonic.config
    assert backend.LANGUAGES == tuple(config.AVAILABLE_LANGUAGES) and set(backend.LANGUAGES) == REFERENCE_LANGUAGES
    assert len(backend.LANGUAGES) == 32 and backend.LANGUAGES[-1] == config.UNKNOWN_LANGUAGE == "na"
    assert (backend.SPEEDS.low, backend.SPEEDS.high) == (config.MIN_SPEED, config.MAX_SPEED)
    assert (backend.STEPS.low, backend.STEPS.high) == (config.MIN_TOTAL_STEPS, config.MAX_TOTAL_STEPS)
    onnx = [str(path) for path in supertonic.loader.get_all_onnx_module_relative_paths()]
    assert list(backend.LAYOUT) == [*onnx, str(config.CFG_REL_PATH), str(config.UNICODE_INDEXER_REL_PATH)]
    assert backend.STYLES == str(config.VOICE_STYLES_DIR)
    assert config.get_model_repo(backend.MODEL_NAME) == backend.HUB_REPO and config.is_multilingual_model("supertonic-3")
    assert sorted(backend.VOICES) == sorted(tiny.VOICES)
    params = inspect.signature(SupertonicTTS).parameters
    assert {SupertonicTTS.voice_key, SupertonicTTS.speed_key} | SupertonicTTS.runtime_keys <= set(params)


def test_the_extra_brings_no_gpl_package_and_the_test_extra_includes_it():
    pending, seen = list(EXTRAS["supertonic"]), set()
    while pending:
        requirement = Requirement(pending.pop())
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name in seen or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        meta = metadata.metadata(name)
        licence = " ".join([meta.get("License-Expression") or "", (meta.get("License") or "")[:200],
                            *(c for c in meta.get_all("Classifier") or [] if c.startswith("License ::"))])
        assert not re.search(r"(?<!L)GPL|(?<!Lesser )General Public License", licence), (name, licence)
        pending += metadata.requires(name) or []
    assert {"supertonic", "onnxruntime", "huggingface-hub", "soundfile", "numpy"} <= seen
    assert any("supertonic" in line for line in EXTRAS["test"]) and any(
        "supertonic" in line for line in EXTRAS["all"])

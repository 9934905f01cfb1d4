"""tts=kitten: onnxruntime on tiny KittenTTS models with the real interface, phonemes from the espeak-ng program."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

import huggingface_hub
import numpy as np
import pytest
import soundfile

from graph_stages import CountingSource, Recognizer, Segmenter, Talker
from s2s import sharing
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.graph import Graph
from s2s.io.file import FileSink
from s2s.messages import ReplyAudio, ReplyText
from s2s.platform import detect, machine_context
from s2s.tts import kitten as backend
from s2s.tts.kitten import KittenTTS
from spies import spy
from tests.conftest import CACHE, compose_config
from onnx_tts import fed, needs_espeak, onnxruntime  # noqa: F401 (onnxruntime: a fixture)
from tests.fixtures import kitten as tiny

HERE = machine_context("tts")  # settings changed in place are judged for this machine, as a session's are
SYMBOLS = {index: symbol for symbol, index in backend.IDS.items()}


@pytest.fixture(scope="session")
def models():
    folder = tiny.cached(CACHE / "models")
    return {"modern": folder / tiny.MODERN, "legacy": folder / tiny.LEGACY}


def make_stage(path, **options) -> KittenTTS:
    stage = KittenTTS(model=str(path), **options)
    stage.setup()
    return stage


def spelled(feed: dict) -> str:
    """The symbols an ``input_ids`` row spells between its boundary ids."""
    return "".join(SYMBOLS[int(index)] for index in feed["input_ids"][0][1:-2])


def spoken_samples(feeds: list[dict]) -> int:
    """What the tiny model says for these feeds once the artefact is cut off."""
    return sum(tiny.samples_for(feed["input_ids"].shape[1], float(feed["speed"][0])) - tiny.TRIM for feed in feeds)


@needs_espeak
def test_sentences_come_out_one_by_one_at_24_khz_with_the_artefact_cut_off(models, onnxruntime, monkeypatch):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    stage = make_stage(models["modern"])
    blocks = stage.synthesize("Hello there. How are you today?", None)
    next(blocks)
    assert len(runs) == 1  # the first sentence is out before the second is made
    rest = list(blocks)
    assert len(rest) == 1 and [spelled(feed)[-1] for feed in fed(runs)] == [".", "?"]
    for feed in fed(runs):
        assert set(feed) == {"input_ids", "style", "speed"}
        ids = feed["input_ids"]
        assert ids.dtype == np.int64 and ids.shape[0] == 1 and ids[0, 0] == 0 and ids[0, -2:].tolist() == [10, 0]
        assert feed["style"].dtype == np.float32 and feed["style"].shape == (1, tiny.STYLE_DIM)
        assert feed["speed"].dtype == np.float32 and feed["speed"].shape == (1,)

    out = list(stage.process(ReplyText("Hello there. How are you today?", turn=4)))
    assert all(isinstance(m, ReplyAudio) and m.sample_rate == 24000 and m.turn == 4 for m in out)
    samples = np.concatenate([m.samples for m in out])
    assert abs(len(samples) - spoken_samples(fed(runs)[2:])) <= 0.05 * 24000  # lead silence at most is shaped
    assert np.abs(samples).max() <= tiny.AMPLITUDE + 1e-3  # the 0.9 artefact at each end is gone


@needs_espeak
def test_ids_are_espeak_ipa_with_words_and_marks_spaced_apart_as_kittens_tokenizer(models, onnxruntime, monkeypatch):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    stage = make_stage(models["modern"])
    list(stage.synthesize("Well, the weather is nice!", None))
    [feed] = fed(runs)
    words = subprocess.run(["espeak-ng", "-q", "--ipa", "-v", "en-us", "Well, the weather is nice!"],
                           capture_output=True, encoding="utf-8", check=True).stdout.split()
    assert spelled(feed) == f"{words[0]} , {' '.join(words[1:])} !"  # "wˈɛl , ðə wˈɛðɚɹ ɪz nˈaɪs !"


@needs_espeak
def test_a_long_first_clause_is_spoken_alone_then_whole_sentences(models, onnxruntime, monkeypatch):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    stage = make_stage(models["modern"])
    blocks = stage.synthesize("Yes, the capital of France, as everyone knows, is Paris. It is big, and old.", None)
    next(blocks)
    assert len(runs) == 1
    list(blocks)
    spoken = [spelled(feed) for feed in fed(runs)]
    assert len(spoken) == 3 and spoken[0].count(",") == 2 and spoken[0].endswith(",")  # "Yes," alone is too short
    assert spoken[1].endswith(".") and spoken[2].count(",") == 1 and spoken[2].endswith(".")


@needs_espeak
def test_voice_alias_row_and_speed_prior_reach_the_models_inputs(models, onnxruntime, monkeypatch):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    text = "The capital of France is Paris."
    heard = {}
    for voice, speed in (("Bella", 1.0), ("expr-voice-2-f", 1.0), ("Hugo", 1.5), ("Leo", 0.5)):
        stage = make_stage(models["modern"], voice=voice, speed=speed)
        heard[voice] = np.concatenate(list(stage.synthesize(text, None)))
    feeds = fed(runs)
    row = len(text)  # KittenML's runtime picks the row by the text's length
    for feed, name in zip(feeds, ("expr-voice-2-f", "expr-voice-2-f", "expr-voice-4-m", "expr-voice-5-m")):
        assert feed["style"] == pytest.approx(np.full((1, tiny.STYLE_DIM), tiny.style_level(name, row)))
    assert [float(feed["speed"][0]) for feed in feeds] == pytest.approx([1.0, 1.0, 1.5 * 0.9, 0.5])  # Hugo's prior
    assert np.array_equal(heard["Bella"], heard["expr-voice-2-f"]) and not np.array_equal(heard["Bella"], heard["Leo"])
    for voice, feed in zip(("Hugo", "Leo"), feeds[2:]):
        assert len(heard[voice]) == spoken_samples([feed])
    assert len(heard["Leo"]) > 1.9 * len(heard["Bella"]) > 2.5 * len(heard["Hugo"])


@needs_espeak
def test_one_row_voices_and_a_folder_without_config_json(models, onnxruntime, monkeypatch, tmp_path):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    make_stage(models["legacy"], voice="expr-voice-5-m").warm_up()
    assert fed(runs)[0]["style"] == pytest.approx(np.full((1, tiny.STYLE_DIM), tiny.style_level("expr-voice-5-m", 0)))
    bare = shutil.copytree(models["legacy"], tmp_path / "bare")
    (bare / "config.json").unlink()
    stage = make_stage(bare, voice="expr-voice-3-f")
    assert len(np.concatenate(list(stage.synthesize("Good morning.", None)))) == spoken_samples(fed(runs)[-1:])


@needs_espeak
def test_a_sentence_longer_than_the_models_context_is_cut_at_spaces(models, onnxruntime, monkeypatch):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    stage = make_stage(models["modern"])
    words = " ".join(["wonderful"] * 90)  # about 900 symbols in one sentence
    list(stage.synthesize(f"{words}.", None))
    feeds = fed(runs)
    assert len(feeds) == 2 and all(feed["input_ids"].shape[1] <= backend.POSITIONS for feed in feeds)
    first, second = (spelled(feed) for feed in feeds)
    assert not first.endswith(" ") and not second.startswith(" ")  # cut at a space, which is dropped
    assert len(first.split()) + len(second.split()) == 91  # 90 words and the final mark, none lost or cut


@needs_espeak
def test_the_thread_budget_reaches_onnxruntime_and_sharing_loads_the_model_once(models):
    stage = KittenTTS(model=str(models["modern"]))
    stage.threads = 2
    stage.setup()
    assert stage._session.get_session_options().intra_op_num_threads == 2
    sharing.enable()
    try:
        first, second = make_stage(models["modern"]), make_stage(models["modern"], voice="Luna")
        assert first._session is second._session and sharing.shared_count() == 1
    finally:
        sharing.enable(False)


@needs_espeak
def test_voice_and_speed_change_in_place_as_a_stage_built_with_them_and_nothing_reloads(models, onnxruntime,
                                                                                         monkeypatch):
    built = make_stage(models["modern"], voice="Luna", speed=1.3)
    expected = np.concatenate(list(built.synthesize("Good morning.", None)))
    stage = make_stage(models["modern"])
    loads = spy(monkeypatch, onnxruntime.InferenceSession, "__init__")
    assert stage.apply_settings({"voice": "Luna", "speed": 1.3}, HERE) is True
    assert np.array_equal(np.concatenate(list(stage.synthesize("Good morning.", None))), expected)
    with pytest.raises(ConfigErrors, match="tts.voice=Nala: invalid; expected the voices of .*: Bella, Jasper"):
        stage.apply_settings({"voice": "Nala"}, HERE)
    with pytest.raises(ConfigErrors, match="tts.speed=3"):
        stage.apply_settings({"speed": 3.0}, HERE)
    assert (stage.voice, stage.speed) == ("Luna", 1.3) and loads == []


def errors_of(overrides) -> list[str]:
    with pytest.raises(ConfigErrors) as caught:
        validate(compose_config(["tts=kitten", *overrides]))
    return [str(error) for error in caught.value.errors]


@needs_espeak
def test_bad_models_voices_and_speeds_fail_validation_naming_the_key(models, tmp_path):
    other = shutil.copytree(models["modern"], tmp_path / "kitten2")
    (other / "config.json").write_text('{"type": "KITTEN2", "model_file": "x.onnx", "voices": "voices.npz"}')
    hollow = shutil.copytree(models["modern"], tmp_path / "hollow")
    (hollow / tiny.MODERN_ONNX).unlink()
    garbled = shutil.copytree(models["modern"], tmp_path / "garbled")
    (garbled / "voices.npz").write_bytes(b"not an archive")
    modern, legacy = models["modern"], models["legacy"]
    published = "Bella, Jasper, Luna, Bruno, Rosie, Hugo, Kiki, Leo, expr-voice-2-m"
    cases = [
        ([f"tts.model={tmp_path}/none"], f"tts.model={tmp_path}/none: invalid; expected a KittenTTS folder "
                                         "(config.json naming the .onnx and voices.npz, or one .onnx and "
                                         "voices.npz): no such folder"),
        ([f"tts.model={other}"], f"tts.model={other}: invalid; expected a KittenTTS folder (config.json naming the "
                                 ".onnx and voices.npz, or one .onnx and voices.npz) of type ONNX1 or ONNX2 (its "
                                 "config.json says KITTEN2)"),
        ([f"tts.model={hollow}"], f"tts.model={hollow}: invalid; expected a KittenTTS folder (config.json naming "
                                  f"the .onnx and voices.npz, or one .onnx and voices.npz): it has no "
                                  f"{tiny.MODERN_ONNX}"),
        ([f"tts.model={garbled}"], f"tts.model={garbled}: invalid; expected a KittenTTS folder whose voices.npz is "
                                   "a numpy archive of voices"),
        ([f"tts.model={modern}", "tts.voice=Nala"], f"tts.voice=Nala: invalid; expected the voices of {modern}: "
                                                    "Bella, Jasper, Luna, Bruno, Rosie, Hugo, Kiki, Leo, expr-voice-2-m"),
        ([f"tts.model={legacy}"], f"tts.voice=Bruno: invalid; expected the voices of {legacy}: expr-voice-2-m, "
                                  "expr-voice-2-f, expr-voice-3-m"),  # 0.1 models have no aliases
        (["tts.voice=Nala"], f"tts.voice=Nala: invalid; expected a voice of the published KittenTTS models: "
                             f"{published}"),  # a hub model not fetched yet
        (["tts.speed=0.4"], "tts.speed=0.4: invalid; expected a number from 0.5 to 2 (inclusive)"),
        (["tts.speed=2.5"], "tts.speed=2.5: invalid; expected a number from 0.5 to 2 (inclusive)"),
    ]
    for overrides, message in cases:
        messages = errors_of(overrides)
        assert len(messages) == 1 and messages[0].startswith(message), (overrides, messages)
    for good in ([], ["tts.model=kitten-tts-nano-0.8", "tts.voice=expr-voice-4-f", "tts.speed=2"],
                 [f"tts.model={modern}", "tts.voice=Kiki"], [f"tts.model={legacy}", "tts.voice=expr-voice-5-f"]):
        validate(compose_config(["tts=kitten", *good]))


def test_a_missing_espeak_ng_is_named_with_its_install_command(models, monkeypatch):
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "espeak-ng" else real(name, *a, **k))
    here = detect()
    install = {"linux": "apt-get install espeak-ng", "macos": "brew install espeak-ng"}.get(here.os, "espeak-ng")
    [message] = errors_of([f"platform={here.platform}", f"tts.model={models['modern']}"])
    assert message.startswith("tts.model=") and "espeak-ng program, which is not on PATH" in message
    assert install in message
    elsewhere = "linux" if here.os != "linux" else "macos"
    validate(compose_config(["tts=kitten", f"platform={elsewhere}"]))  # a preview for another OS: our PATH is not its
    with pytest.raises(RuntimeError, match=re.escape("tts=kitten needs the espeak-ng program, which is not on PATH")):
        KittenTTS(model=str(models["modern"])).setup()


@needs_espeak
def test_offline_a_model_not_in_the_cache_fails_before_loading_saying_how_to_get_it(onnxruntime, monkeypatch,
                                                                                      tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    loads = spy(monkeypatch, onnxruntime.InferenceSession, "__init__")
    validate(compose_config(["tts=kitten"]))  # the published voices are checked; the cache is setup's business
    with pytest.raises(RuntimeError) as caught:
        KittenTTS(model="kitten-tts-nano-0.8", voice="Kiki").setup()
    message = str(caught.value)
    assert "tts.model=kitten-tts-nano-0.8 is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids" in message
    assert "hf download KittenML/kitten-tts-nano-0.8 --local-dir kitten-tts-nano-0.8" in message
    assert loads == []


@needs_espeak
def test_a_hub_id_is_read_from_the_hugging_face_cache_offline(models, onnxruntime, monkeypatch, tmp_path):
    repo = "KittenML/kitten-tts-tiny-0.8"
    snapshot = tiny.hub_cache(tmp_path, repo, models["modern"])
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert errors_of(["tts.model=kitten-tts-tiny-0.8", "tts.voice=Nala"]) == [
        f"tts.voice=Nala: invalid; expected the voices of {repo}: Bella, Jasper, Luna, Bruno, Rosie, Hugo, Kiki, Leo, "
        + ", ".join(tiny.VOICES)]  # the cached model's own voices
    loads = spy(monkeypatch, onnxruntime.InferenceSession, "__init__")
    stage = make_stage(repo, voice="Rosie")
    assert [call.args[1] for call in loads] == [str(snapshot / tiny.MODERN_ONNX)]
    assert len(np.concatenate(list(stage.synthesize("Hello there.", None)))) > 0


@needs_espeak
def test_online_the_config_is_fetched_first_then_the_files_it_names(models, onnxruntime, monkeypatch, tmp_path):
    """The hub is out of reach here: a stand-in for ``hf_hub_download`` serves the tiny model as the hub would."""
    fetched = []

    def hf_hub_download(repo_id: str, filename: str) -> str:
        fetched.append(filename)
        snapshot = tmp_path / "hub" / repo_id / "snapshot"
        snapshot.mkdir(parents=True, exist_ok=True)
        shutil.copy(models["modern"] / filename, snapshot / filename)
        return str(snapshot / filename)

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    stage = make_stage("KittenML/kitten-tts-tiny-0.8")
    assert fetched == ["config.json", tiny.MODERN_ONNX, "voices.npz"]
    assert len(np.concatenate(list(stage.synthesize("Hello there.", None)))) > 0


@needs_espeak
def test_the_backend_speaks_through_the_real_runner_and_the_sink_resamples(models, onnxruntime, monkeypatch,
                                                                             tmp_path):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    sink = FileSink(str(tmp_path / "reply.wav"), sample_rate=16000, turn_gap_ms=300)
    stage = KittenTTS(model=str(models["modern"]), voice="Jasper", speed=1.25)
    graph = Graph([("source", CountingSource(turns=2)), ("vad", Segmenter()), ("stt", Recognizer()),
                   ("llm", Talker(words=2)), ("tts", stage), ("sink", sink)])
    graph.setup()
    warm_up = len(runs)
    try:
        assert graph.run().status == "completed"
    finally:
        graph.close()
    samples, rate = soundfile.read(str(tmp_path / "reply.wav"), dtype="float32")
    feeds = fed(runs)[warm_up:]
    assert len(feeds) == 4 and all(spelled(feed).endswith(".") for feed in feeds)  # "turn N word M." each
    seconds = spoken_samples(feeds) / 24000 + 0.3  # one turn gap
    assert rate == 16000 and abs(len(samples) / rate - seconds) < 0.005 and np.abs(samples).max() > 0.1
    assert "phonemizer" not in sys.modules  # no GPL package came in on the way


def test_the_symbol_table_is_the_models():
    assert len(backend.SYMBOLS) == 178 and backend.IDS["$"] == 0 and backend.IDS["…"] == backend.END == 10
    assert backend.IDS[" "] == 16 and backend.IDS['"'] == 15 and backend.IDS["a"] == 43 and backend.IDS["ᵻ"] == 177
    assert backend.IDS["ˈ"] == 156 and backend.IDS["ɚ"] == 85

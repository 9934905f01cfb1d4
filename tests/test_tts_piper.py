"""tts=piper on tiny random-weight VITS ONNX voices with Piper's I/O, and the packaged en_US-joe-medium end to end."""
from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import time
import unicodedata

import numpy as np
import pytest

from s2s.platform import machine_context
from s2s import audio, sharing
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.messages import ReplyAudio, ReplyText
from s2s.platform import detect
from s2s.tts.piper import PiperTTS
from spies import spy
from tests.conftest import CACHE, compose_config
from onnx_tts import fed, needs_espeak, onnxruntime  # noqa: F401 (onnxruntime: a fixture)
from tests.fixtures import piper as tiny



HERE = machine_context("tts")  # settings changed in place are judged for this machine, as a session's are

@pytest.fixture(scope="session")
def voices():
    folder = tiny.cached(CACHE / "models")
    return {"single": folder / tiny.SINGLE, "multi": folder / tiny.MULTI}


def make_stage(path, **options) -> PiperTTS:
    stage = PiperTTS(model=str(path), **options)
    stage.setup()
    return stage


def symbols(stage: PiperTTS, ids) -> str:
    """The phonemes an id sequence spells (pads, BOS and EOS left out)."""
    names = {value[0]: symbol for symbol, value in stage._ids.items()}
    return "".join(names[int(i)] for i in ids[2:-1:2])


@needs_espeak
def test_audio_comes_out_at_the_rate_of_the_voice_json(voices, onnxruntime, monkeypatch):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    stage = make_stage(voices["single"])
    out = list(stage.process(ReplyText("Hello there. How are you today?", turn=3)))

    assert stage.sample_rate == tiny.SAMPLE_RATE != PiperTTS.sample_rate  # from the JSON, not the class default
    assert out and all(isinstance(m, ReplyAudio) and m.sample_rate == tiny.SAMPLE_RATE and m.turn == 3 for m in out)
    samples = np.concatenate([m.samples for m in out])
    assert samples.dtype == np.float32 and np.isfinite(samples).all() and len(samples) > 0.2 * tiny.SAMPLE_RATE
    assert [symbols(stage, feed["input"][0])[-1] for feed in fed(runs)] == [".", "?"]  # one call per sentence
    for feed in fed(runs):
        assert set(feed) == {"input", "input_lengths", "scales"}  # a one-speaker voice gets no sid
        assert feed["input"].dtype == np.int64 and feed["input_lengths"].tolist() == [feed["input"].shape[1]]
        assert feed["scales"].dtype == np.float32 and feed["scales"].tolist() == pytest.approx([0.667, 1.0, 0.8])


@needs_espeak
def test_phoneme_ids_interleave_pads_between_bos_and_eos(voices):
    stage = make_stage(voices["single"])
    [[first, second]] = stage.phonemize("Hello there, my friend.")
    assert first.endswith(", ") and second.endswith(".")  # punctuation kept, a space after a comma
    ids = stage.phoneme_ids(first + second)
    assert ids[:2] == stage._ids["^"] + stage._ids["_"] and ids[-1:] == stage._ids["$"]
    assert set(ids[1:-1:2]) == set(stage._ids["_"])
    assert symbols(stage, ids) == unicodedata.normalize("NFD", first + second)  # decomposed codepoints


@needs_espeak
def test_clauses_give_the_ipa_espeak_gives_for_the_whole_text_from_its_running_espeak(voices, monkeypatch):
    text = "Well, Mr. and Mrs. Smith paid $5.50 for 3 apples; how odd! Dr. Jones said: it's fine. Yes? No."
    stage = make_stage(voices["single"])
    processes = spy(monkeypatch, subprocess, "Popen")
    sentences = stage.phonemize(text)
    assert stage.phonemize(text) == sentences and len(processes) == 1  # one espeak-ng answers both texts
    monkeypatch.undo()
    own = subprocess.run(["espeak-ng", "-q", "-b", "1", "--ipa", "-v", "en-us", text], capture_output=True,
                         encoding="utf-8", check=True).stdout.split()  # espeak cutting its own clauses
    assert re.sub(r"[,;:.!?]", " ", "".join(clause for sentence in sentences for clause in sentence)).split() == own
    ends = [sentence[-1].rstrip()[-1] for sentence in sentences]
    assert ends == [".", "!", ".", ".", "?", "."]  # "Mr. and" goes on, "Mrs. Smith" and "Dr. Jones" end one


@needs_espeak
def test_the_first_clause_is_synthesized_on_its_own_then_whole_sentences(voices, onnxruntime, monkeypatch):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    stage = make_stage(voices["single"])
    blocks = stage.synthesize("Yes, the capital of France, as everyone knows, is Paris. It is big, and old.", None)
    next(blocks)
    assert len(runs) == 1  # the first audio is out before the rest is synthesized
    rest = list(blocks)
    spoken = [symbols(stage, feed["input"][0]) for feed in fed(runs)]
    assert len(rest) == 2 and len(spoken) == 3
    assert spoken[0].count(",") == 2 and spoken[0].endswith(", ")  # "Yes, " is too short alone: it joins
    assert spoken[1].endswith(".") and spoken[2].count(",") == 1 and spoken[2].endswith(".")


@needs_espeak
def test_speed_scales_the_length_and_sentence_silence_is_added_between_sentences(voices, onnxruntime, monkeypatch):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    text = "The capital of France is Paris."
    lengths = {}
    for speed in (0.5, 1.0, 2.0):  # without noise the tiny voice's durations are fixed
        stage = make_stage(voices["single"], speed=speed, noise_scale=0.0, noise_w=0.0)
        lengths[speed] = sum(len(block) for block in stage.synthesize(text, None))
    assert [feed["scales"].tolist() for feed in fed(runs)] == [[0.0, 2.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.5, 0.0]]
    assert 1.6 < lengths[0.5] / lengths[1.0] < 2.4 and lengths[2.0] <= lengths[1.0]

    paused = make_stage(voices["single"], noise_scale=0.0, noise_w=0.0, sentence_silence_s=0.5)
    blocks = list(paused.synthesize(f"{text} {text}", None))
    assert len(blocks) == 3 and len(blocks[1]) == 0.5 * tiny.SAMPLE_RATE and not blocks[1].any()


@needs_espeak
def test_speaker_selects_the_sid_by_name_or_id(voices, onnxruntime, monkeypatch):
    runs = spy(monkeypatch, onnxruntime.InferenceSession, "run")
    heard = {}
    for speaker in (None, "bob", 2, "carol"):
        stage = make_stage(voices["multi"], speaker=speaker, noise_scale=0.0, noise_w=0.0)
        heard[speaker] = np.concatenate(list(stage.synthesize("Hello there.", None)))
    assert [feed["sid"].tolist() for feed in fed(runs)] == [[0], [1], [2], [2]]
    assert np.array_equal(heard[2], heard["carol"]) and not np.array_equal(heard["bob"], heard["carol"])


@needs_espeak
def test_the_thread_budget_reaches_onnxruntime_and_sharing_loads_the_voice_once(voices):
    stage = PiperTTS(model=str(voices["single"]))
    stage.threads = 2
    stage.setup()
    assert stage._session.get_session_options().intra_op_num_threads == 2
    sharing.enable()
    try:
        first, second = make_stage(voices["single"]), make_stage(voices["single"], speed=1.2)
        assert first._session is second._session and sharing.shared_count() == 1
    finally:
        sharing.enable(False)


def errors_of(overrides) -> list[str]:
    with pytest.raises(ConfigErrors) as caught:
        validate(compose_config(["tts=piper", *overrides]))
    return [str(error) for error in caught.value.errors]


@needs_espeak
def test_bad_voices_speakers_and_speeds_fail_validation_naming_the_key(voices, tmp_path):
    lonely = tmp_path / "lonely.onnx"
    shutil.copy(voices["single"], lonely)
    cases = [
        ([f"tts.model={tmp_path}/missing.onnx"], f"tts.model={tmp_path}/missing.onnx: invalid; expected an existing"),
        ([f"tts.model={lonely}"], f"tts.model={lonely}: invalid; expected a Piper voice .onnx file with its config "
                                  "beside it (lonely.onnx.json is missing)"),
        ([f"tts.model={voices['multi']}", "tts.speaker=dave"],
         "tts.speaker=dave: invalid; expected a speaker of this voice: a name (alice, bob, carol) or an id from 0 to 2"),
        ([f"tts.model={voices['multi']}", "tts.speaker=3"], "tts.speaker=3: invalid; expected a speaker of this voice"),
        ([f"tts.model={voices['single']}", "tts.speaker=bob"],
         "tts.speaker=bob: invalid; expected null (this voice has one speaker)"),
        (["tts.speaker=1"], "tts.speaker=1: invalid; expected null (this voice has one speaker)"),  # joe
        (["tts.speed=0"], "tts.speed=0: invalid; expected a number from 0.25 to 4"),
        (["tts.noise_w=3"], "tts.noise_w=3: invalid; expected a number from 0 to 2"),
    ]
    for overrides, message in cases:
        messages = errors_of(overrides)
        assert len(messages) == 1 and messages[0].startswith(message), (overrides, messages)
    for good in ([], [f"tts.model={voices['multi']}", "tts.speaker=bob"], [f"tts.model={voices['multi']}",
                                                                         "tts.speaker=0"]):
        validate(compose_config(["tts=piper", *good]))


def test_a_missing_espeak_ng_is_named_with_its_install_command(voices, monkeypatch):
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "espeak-ng" else real(name, *a, **k))
    here = detect()
    install = {"linux": "apt-get install espeak-ng", "macos": "brew install espeak-ng"}.get(here.os, "espeak-ng")
    for model in ([], [f"tts.model={voices['single']}"]):
        [message] = errors_of([f"platform={here.platform}", *model])
        assert message.startswith("tts.model=") and "espeak-ng program, which is not on PATH" in message
        assert install in message
    elsewhere = "linux" if here.os != "linux" else "macos"
    validate(compose_config(["tts=piper", f"platform={elsewhere}"]))  # a preview for another OS: our PATH is not its
    with pytest.raises(RuntimeError, match=re.escape("espeak-ng program, which is not on PATH; install it with: ")):
        PiperTTS(model=str(voices["single"])).setup()


# ------------------------------------------------------------------ the packaged voice, end to end
ROUND_TRIP = [  # (sentence, key words): each sentence alone is a turn's chunk
    ("The weather in Paris is sunny and warm today.", "weather paris sunny warm today"),
    ("Please turn off the kitchen lights before you leave.", "turn kitchen lights leave"),
    ("My brother plays the guitar, and my sister sings.", "brother plays guitar sister sings"),
    ("The train to London leaves in the morning.", "train london leaves morning"),
    ("Can you recommend a good book about history?", "recommend good book history"),
]


@pytest.fixture(scope="module")
def joe():
    stage = PiperTTS()
    stage.setup()
    stage.warm_up()
    yield stage
    stage.close()


@pytest.fixture(scope="module")
def whisper():
    from faster_whisper import WhisperModel

    from s2s.stt.faster_whisper import resolve_model

    model = WhisperModel(resolve_model("tiny.en"), device="cpu", compute_type="int8")

    def transcribe(samples: np.ndarray) -> list[str]:
        segments, _ = model.transcribe(samples, language="en", beam_size=5)  # greedy int8 depends on the CPU
        return re.findall(r"[a-z']+", " ".join(segment.text for segment in segments).lower())

    return transcribe


@pytest.mark.slow
@needs_espeak
def test_joe_speaks_sentences_whisper_understands(joe, whisper):
    hits, total = 0, 0
    for sentence, keys in ROUND_TRIP:
        blocks = [m for m in joe.process(ReplyText(sentence, 0)) if isinstance(m, ReplyAudio)]
        assert {block.sample_rate for block in blocks} == {22050}
        heard = set(whisper(audio.to_pipeline(np.concatenate([b.samples for b in blocks]), 22050, 16000)))
        hits += sum(key in heard for key in keys.split())
        total += len(keys.split())
    assert hits >= 0.8 * total, f"{hits}/{total} key words heard"


def _first_audio_s(stage: PiperTTS, text: str) -> tuple[float, float, float]:
    """(seconds to the first audio block, seconds for all of it, seconds of audio) through ``process``."""
    start = time.perf_counter()
    first, samples = None, 0
    for message in stage.process(ReplyText(text, 0)):
        first = first if first is not None else time.perf_counter() - start
        samples += len(message.samples)
    return first, time.perf_counter() - start, samples / stage.sample_rate


@pytest.mark.slow
@needs_espeak
def test_joe_first_audio_comes_before_the_whole_reply(joe):
    """Prints warm first-audio times and RTF (medians of 3) for 1 and 2 threads; asserts only the streaming."""
    short = "The capital is Paris."
    long = ("Paris is the capital of France, and it has been home to artists, writers and scientists for "
            "hundreds of years.")
    for threads in (1, 2):
        stage = PiperTTS()
        stage.threads = threads
        stage.setup()
        stage.warm_up()
        for name, text in (("4 words", short), ("20 words", long)):
            runs = [_first_audio_s(stage, text) for _ in range(3)]
            first, whole, seconds = (statistics.median(run[i] for run in runs) for i in range(3))
            print(f"\npiper joe, {threads} thread(s), {name}: first audio {first * 1000:.0f} ms, "
                  f"all {whole * 1000:.0f} ms for {seconds:.2f} s of audio (RTF {whole / seconds:.3f})")
            if name == "20 words":
                assert first < 0.8 * whole  # the first clause came out on its own
        stage.close()


@needs_espeak
def test_speaker_and_speed_change_in_place_as_a_stage_built_with_them_and_nothing_reloads(voices, onnxruntime,
                                                                                            monkeypatch):
    quiet = {"noise_scale": 0.0, "noise_w": 0.0}
    built = make_stage(voices["multi"], speaker="bob", speed=1.5, **quiet)
    expected = np.concatenate(list(built.synthesize("Hello there.", None)))
    stage = make_stage(voices["multi"], **quiet)
    loads = spy(monkeypatch, onnxruntime.InferenceSession, "__init__")
    assert stage.apply_settings({"speaker": "bob", "speed": 1.5}, HERE) is True
    assert np.array_equal(np.concatenate(list(stage.synthesize("Hello there.", None))), expected)
    assert loads == [] and stage.settings()["speaker"] == "bob"
    with pytest.raises(ConfigErrors, match="tts.speaker=dave: invalid; expected a speaker of this voice"):
        stage.apply_settings({"speaker": "dave"}, HERE)  # the config's own rule; nothing changed
    with pytest.raises(ConfigErrors, match="tts.speed=9"):
        stage.apply_settings({"speed": 9.0}, HERE)
    assert (stage.speaker, stage.speed) == ("bob", 1.5)
    assert stage.apply_settings({"model": str(voices["single"])}, HERE) is False and stage.model == str(voices["multi"])
    make_stage(voices["single"])
    assert len(loads) == 1  # the spy sees a load: a new stage loads its model, a change in place does not

"""stt=moonshine: the packaged Moonshine base (moonshine-cpp's files) converted once for onnxruntime, on real
people's speech and the bundled question; its bounds on silence; validation before any model loads."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import compose_config
from s2s import audio
from s2s.bench.real_speech import recordings
from s2s.bench.roundtrip import whisper_normalised_errors
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.messages import SpeechSegment, SpeechSoFar, Transcript, TurnEnd
from s2s.models import package_file
from s2s.stt import moonshine_convert
from s2s.stt.moonshine import MoonshineSTT, pieces, read_tokens

QUESTION = Path(__file__).resolve().parents[1] / "s2s" / "samples" / "question.wav"


@pytest.fixture(scope="module")
def stt(tmp_path_factory):
    pytest.importorskip("moonshine_cpp")
    stage = MoonshineSTT(at_pause=True, cache_dir=str(tmp_path_factory.mktemp("cache")))
    stage.setup()
    stage.warm_up()
    yield stage
    stage.close()


def test_the_tokenizer_file_is_read_whole():
    folder = package_file("moonshine_cpp", "models", "base-en")
    if folder is None:
        pytest.skip("moonshine-cpp is not installed")
    tokens = read_tokens(folder / "tokenizer.bin")
    assert tokens[:3] == [b"<unk>", b"<s>", b"</s>"] and len(tokens) == 32000
    assert tokens[3:259] == [bytes([byte]) for byte in range(256)]  # the byte fallback


def test_real_speech_is_heard_with_a_margin(stt):
    """The 12 real recordings: at most 6 % of words wrong after Whisper's normaliser (2.5 % measured on one and
    on two threads; the unsigned weights' integer products are exact on every CPU, and onnxruntime has no switch to
    force another CPU's kernels), and the names "Gregson" (tiny.en: "Greggs in") and "Dashwood"."""
    clips = recordings()
    errors = words = 0
    heard = []
    for clip in clips:
        [out] = list(stt.process(SpeechSegment(clip.samples, 16000, 0, 0.0, 5.0)))
        assert isinstance(out, Transcript) and out.language == "en"
        wrong, count = whisper_normalised_errors(clip.text, out.text)
        errors, words, heard = errors + wrong, words + count, heard + [out.text]
    assert errors / words <= 0.06, heard
    assert sum("Gregson" in text or "Dashwood" in text for text in heard) == 2, heard


def test_the_bundled_question_and_resampled_input(stt):
    question = audio.read_audio(QUESTION, 16000)
    for rate in (16000, 44100):
        samples = audio.resample(question, 16000, rate)
        [out] = list(stt.process(SpeechSegment(samples, rate, 3, 0.0, 2.0)))
        assert "capital of france" in out.text.lower()


def test_silence_and_noise_give_no_reply_and_every_decode_is_bounded(stt):
    quiet = np.zeros(16000, np.float32)
    assert list(stt.process(SpeechSegment(quiet, 16000, 4, 0.0, 1.0))) == [TurnEnd(4)]
    noise = (np.random.default_rng(0).standard_normal(16000 * 3) * 0.01).astype(np.float32)
    text, _ = stt.recognise(noise)
    assert len(text.split()) <= 8 * 3 + 8  # the bound: TOKENS_PER_S a second, plus TOKENS_MORE
    blip = np.zeros(800, np.float32)  # 50 ms: shorter than the encoder's convolutions take alone
    assert stt.recognise(blip)[0] == ""


def test_the_pause_pass_is_the_segments_transcript(stt):
    clip = recordings()[8].samples
    stt.reset()
    assert not list(stt.process(SpeechSoFar((clip,), 16000, 5, 1.0, paused=True)))
    decodes = []
    original = stt._generate
    stt._generate = lambda samples, forced: decodes.append((len(samples), forced)) or original(samples, forced)
    try:
        [out] = list(stt.process(SpeechSegment(clip, 16000, 5, 1.0, 4.0)))
        assert decodes == []  # the pass at the pause heard exactly this audio
        longer = np.concatenate([clip, np.zeros(1600, np.float32)])
        [again] = list(stt.process(SpeechSegment(longer, 16000, 6, 1.0, 4.1)))
        assert decodes == [(len(longer), [])]  # more audio than the pass heard: decoded whole, nothing forced
    finally:
        del stt._generate
    assert out.text == again.text == stt.recognise(clip)[0]


def test_passes_while_speaking_commit_words_and_the_turn_decodes_only_the_rest(stt):
    """stt.incremental_s: the words three passes agree on are committed, the turn's decode reads their tokens in
    one call and makes only the rest, and the transcript is what one pass over the whole utterance hears."""
    clips = [clip.samples for clip in recordings()[:2]]  # 4.9 and 5.6 s
    stt.incremental_s = 0.5
    forced = []
    original = stt._generate
    stt._generate = lambda samples, tokens: forced.append(len(tokens)) or original(samples, tokens)
    try:
        for turn, clip in enumerate(clips):
            stt.reset()
            for end in range(8000, len(clip), 8000):  # the speech so far, every half second
                list(stt.process(SpeechSoFar((clip[:end],), 16000, turn, float(turn))))
            assert stt._utterance is not None and len(stt._utterance.committed) >= 5
            forced.clear()
            [out] = list(stt.process(SpeechSegment(clip, 16000, turn, float(turn), 9.0)))
            assert len(forced) == 1 and forced[0] >= 5  # one decode, its committed words read, not made
            whole = stt.recognise(clip)[0]
            assert whisper_normalised_errors(whole, out.text)[0] <= 1, (whole, out.text)
    finally:
        del stt._generate
        stt.incremental_s = None


def test_bad_models_fail_before_anything_loads(tmp_path):
    with pytest.raises(ConfigErrors, match=r"stt\.model.*base\.en"):
        validate(compose_config(["stt=moonshine", "stt.model=UsefulSensors/moonshine-base"]))
    (tmp_path / "tokenizer.bin").write_bytes(b"")
    with pytest.raises(ConfigErrors, match=r"stt\.model.*lacks encoder_model\.ort\|\.onnx"):
        validate(compose_config(["stt=moonshine", f"stt.model={tmp_path}"]))
    with pytest.raises(ConfigErrors, match=r"stt\.model.*no such folder"):
        validate(compose_config(["stt=moonshine", f"stt.model={tmp_path / 'absent'}"]))
    with pytest.raises(ConfigErrors, match=r"stt\.language"):
        validate(compose_config(["stt=moonshine", "stt.language=de"]))
    assert moonshine_convert.missing(tmp_path) == ["encoder_model.ort|.onnx", "decoder_model_merged.ort|.onnx"]


def test_speech_longer_than_a_piece_is_cut_where_it_is_quietest_and_heard_whole(stt):
    """Seven real sentences, 0.3 s apart (36 s): two pieces, cut in a gap between sentences, and every
    sentence's words heard (at most 8 % wrong after the normaliser)."""
    clips = recordings()[:7]
    gap = np.zeros(4800, np.float32)
    speech = np.concatenate([part for clip in clips for part in (clip.samples, gap)])
    cut = [len(piece) for piece in pieces(speech)]
    assert len(cut) == 2 and sum(cut) == len(speech) and cut[0] <= 30 * 16000
    ends = np.cumsum([len(clip.samples) + len(gap) for clip in clips])
    assert any(end - len(gap) <= cut[0] <= end for end in ends)  # inside a gap
    text, _ = stt.recognise(speech)
    wrong, words = whisper_normalised_errors(" ".join(clip.text for clip in clips), text)
    assert wrong / words <= 0.08, text

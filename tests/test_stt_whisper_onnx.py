"""stt.cpu_decoder=onnxruntime: Whisper's greedy decode on onnxruntime, from the same CTranslate2 weights
(s2s/stt/whisper_onnx.py, s2s/stt/whisper_onnx_build.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from s2s.bench import real_speech
from s2s.stt.faster_whisper import FasterWhisperSTT, resolve_model
from s2s.stt.whisper_onnx import Vocabulary, _timestamp_rules
from s2s.stt.whisper_onnx_build import built, read_weights
from tests.conftest import CACHE
from tests.fixtures import tiny_whisper

END, STAMPS, SIZE = 50, 51, 101  # words below 50, the end, then 50 timestamps (Whisper's specials lie between)
WORDS = Vocabulary(start=40, end=END, no_speech=41, no_timestamps=42, first_timestamp=STAMPS)


def allowed(tokens: list[int], first_timestamp: int = 5) -> set[int]:
    """The tokens the rules leave open after ``tokens``, every word as likely and each timestamp far less."""
    scores = np.zeros(SIZE, np.float32)
    scores[STAMPS:] = -10.0
    _timestamp_rules(scores, tokens, WORDS, first_timestamp)
    return set(np.flatnonzero(np.isfinite(scores)).tolist())


def test_the_first_token_is_a_timestamp_of_at_most_the_first_second():
    assert allowed([]) == set(range(STAMPS, STAMPS + 6))


def test_timestamps_come_in_pairs_and_never_go_back():
    words = set(range(END + 1))  # and the end
    assert allowed([STAMPS + 2, 7]) == words | set(range(STAMPS + 3, SIZE))  # a word: another, the end or a later time
    assert allowed([STAMPS, 7, STAMPS + 4]) == {END} | set(range(STAMPS + 4, SIZE))  # opened: its pair or the end
    assert allowed([STAMPS, 7, STAMPS + 4, STAMPS + 4]) == words  # a closed pair: a word or the end


def test_timestamps_together_likelier_than_any_word_leave_only_timestamps():
    scores = np.full(SIZE, -5.0, np.float32)
    scores[STAMPS + 10:] = 0.0  # 40 timestamps, each as likely as the likeliest word
    scores[7] = 0.0
    _timestamp_rules(scores, [STAMPS, 7], WORDS, 5)
    assert not np.isfinite(scores[:STAMPS]).any() and np.isfinite(scores[STAMPS + 10:]).all()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The tiny trained Whisper converted by CTranslate2's own converter, in float32 and in int8."""
    from s2s import torch_support

    torch_support.repair_torchaudio()
    import ctranslate2

    source = tiny_whisper.cached(CACHE / "models")
    out = tmp_path_factory.mktemp("ct2")
    converter = ctranslate2.converters.TransformersConverter(str(source), copy_files=["tokenizer.json",
                                                                                      "preprocessor_config.json"])
    for quantization in ("float32", "int8"):
        converter.convert(str(out / quantization), quantization=quantization)
    return out


def test_the_decoder_makes_ctranslate2s_greedy_tokens_on_a_tiny_multilingual_whisper(converted, tmp_path):
    """The tiny model's tones, in two languages (a prompt of three tokens), each heard by CTranslate2's greedy
    ``generate`` and by this decoder built from the same float32 weights: the same tokens, timestamps included."""
    import onnxruntime
    from faster_whisper import WhisperModel
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_suppressed_tokens

    from s2s.stt.whisper_onnx import GreedyDecoder

    model = WhisperModel(str(converted / "float32"), compute_type="float32", cpu_threads=1)
    decoder = GreedyDecoder(onnxruntime, built(converted / "float32", str(tmp_path)), 1)
    compared = 0
    for frequency in (220.0, 330.0, 880.0, 0.0):
        encoded = model.encode(model.feature_extractor(tiny_whisper.tone(frequency))[:, :200])
        for language in ("en", "de"):
            tokenizer = Tokenizer(model.hf_tokenizer, True, task="transcribe", language=language)
            prompt, suppressed = list(tokenizer.sot_sequence), get_suppressed_tokens(tokenizer, [-1])
            [result] = model.model.generate(encoded, [prompt], beam_size=1, max_length=20, suppress_blank=True,
                                            suppress_tokens=suppressed, return_scores=True,
                                            return_no_speech_prob=True, max_initial_timestamp_index=2)
            vocabulary = FasterWhisperSTT._vocabulary(tokenizer)
            made = decoder.decode(np.asarray(encoded), prompt, vocabulary, suppressed, 10, 2)
            tokens = result.sequences_ids[0]
            assert made.tokens == tokens and tokens[0] >= tokenizer.timestamp_begin, (frequency, language)
            assert made.confidence == pytest.approx(result.scores[0] * len(tokens) / (len(tokens) + 1), abs=0.01)
            assert made.no_speech == pytest.approx(result.no_speech_prob, abs=0.01)
            compared += 1
    assert compared == 8


def test_int8_weights_are_read_back_within_their_rounding(converted):
    plain, rounded = read_weights(converted / "float32" / "model.bin"), read_weights(converted / "int8" / "model.bin")
    assert plain.keys() == rounded.keys()
    matrices = [name for name, value in plain.items() if name.endswith("/weight") and value.ndim == 2]
    assert len(matrices) >= 10
    for name in matrices:
        step = np.abs(plain[name]).max(axis=1, keepdims=True) / 127  # a row's int8 step
        assert rounded[name].dtype == np.float32 and np.all(np.abs(rounded[name] - plain[name]) <= step * 0.51 + 1e-7)


def test_the_decoder_is_built_once_per_model_into_the_cache(converted, tmp_path):
    folder = built(converted / "float32", str(tmp_path))
    made = (folder / "step.onnx").stat().st_mtime_ns
    assert built(converted / "float32", str(tmp_path)) == folder and (folder / "step.onnx").stat().st_mtime_ns == made
    assert built(converted / "int8", str(tmp_path)) != folder  # another model.bin, another folder


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """The default STT with each greedy decoder, on the packaged tiny.en."""
    cache = str(tmp_path_factory.mktemp("cache"))
    made = {}
    for decoder in ("ctranslate2", "onnxruntime"):
        made[decoder] = FasterWhisperSTT(window_s=10, beam_below=-0.6, cpu_decoder=decoder, cache_dir=cache)
        made[decoder].setup()
    return made


class Counted:
    """A decoder (onnxruntime's or CTranslate2's model), its calls counted; the library does the work."""

    def __init__(self, wrapped, method):
        self.wrapped, self.method, self.calls = wrapped, method, 0

    def __getattr__(self, name):
        found = getattr(self.wrapped, name)
        if name != self.method:
            return found

        def counted(*args, **kwargs):
            self.calls += 1
            return found(*args, **kwargs)
        return counted


@pytest.mark.parametrize(("beam_below", "greedy", "generated"), [(-10.0, 1, 0), (0.0, 1, 1)])
def test_onnxruntime_makes_the_greedy_decode_and_ctranslate2_the_beams(stages, beam_below, greedy, generated):
    """Sure enough (no average is under -10): onnxruntime's decode alone; never sure (every average is under 0):
    then CTranslate2's beams."""
    from s2s import audio
    from s2s.resolvers import sample

    stage = stages["onnxruntime"]
    stage.beam_below = beam_below
    greedy_spy = stage._greedy = Counted(stage._greedy, "decode")
    beams_spy = stage._model.model = Counted(stage._model.model, "generate")
    try:
        text, _ = stage.transcribe(audio.read_audio(sample("question.wav"), 16000))
    finally:
        stage._greedy, stage._model.model, stage.beam_below = greedy_spy.wrapped, beams_spy.wrapped, -0.6
    assert (greedy_spy.calls, beams_spy.calls) == (greedy, generated)
    assert "capital of france" in text.lower(), text


def test_onnxruntime_hears_real_people_as_ctranslate2_does(stages):
    """The 12 real recordings: measured, the same words on all 12 and 6 errors in 163 words for both (an AVX2 EPYC;
    the same under CT2_FORCE_CPU_ISA=AVX and GENERIC and on two threads; float32 CTranslate2 beside it, 5 and 5);
    the margin allows two."""
    from s2s.bench.roundtrip import whisper_normalised_errors

    if real_speech.missing(real_speech.FOLDER):
        pytest.skip(real_speech.missing_message(real_speech.FOLDER))
    errors, words, same = {"ctranslate2": 0, "onnxruntime": 0}, 0, 0
    for recording in real_speech.recordings():
        heard = {name: stage.transcribe(recording.samples)[0] for name, stage in stages.items()}
        same += heard["ctranslate2"] == heard["onnxruntime"]
        for name, text in heard.items():
            wrong, count = whisper_normalised_errors(recording.text, text)
            errors[name] += wrong
        words += count
    assert same >= 10, same
    assert errors["onnxruntime"] <= errors["ctranslate2"] + 2 and errors["onnxruntime"] <= 0.06 * words, errors


def test_silence_is_no_words_with_either_decoder(stages):
    from s2s import audio

    for stage in stages.values():
        assert stage.transcribe(audio.silence(1.5, 16000))[0] == ""


def test_the_packaged_model_is_what_gets_built(stages):
    folder = Path(resolve_model("tiny.en"))
    weights = read_weights(folder / "model.bin")
    assert weights["decoder/projection/weight"] is weights["decoder/embeddings/weight"]  # tied, read once
    assert int(weights["decoder/num_heads"]) == stages["onnxruntime"]._greedy.heads == 6

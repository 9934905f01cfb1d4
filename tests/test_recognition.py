"""The default STT (packaged Whisper tiny.en, as conf/stt/faster_whisper.yaml sets it) across espeak voices and rates.

Whisper's output flips on small differences (the CPU's instruction set, int8 or float32, the resampler, the encoder
window): one word of one clip is never asserted. The set is scored as a whole, with a margin under what every variant
measured here reached (python -m s2s.bench recognition, under CT2_FORCE_CPU_ISA=AVX and GENERIC, int8 and float32,
windows of 10, 15 and 30 s, greedy, beam 5 and greedy first (stt.beam_below): 92-95% of the set's words heard).
"""
from __future__ import annotations

import re

import pytest
from conftest import compose_config

from s2s import audio
from s2s.bench.recognition import RATES, SENTENCES, VOICES
from s2s.bench.speech import espeak, espeak_available
from s2s.messages import SpeechSegment, Transcript, TurnEnd
from s2s.stt.faster_whisper import BEST_OF, HOTTER, LOW_LOGPROB, FasterWhisperSTT

pytestmark = pytest.mark.slow
MIN_WORDS_HEARD = 0.85  # of every word of every sentence in every voice and rate
MIN_WORDS_HEARD_BASE = 0.80  # stt.model=base, multilingual: 86-87 % measured


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def default_stt(**changes):
    """The STT stage exactly as the default config builds it (compute_type, beam_size, window_s from the file)."""
    cfg = compose_config([])
    stage = FasterWhisperSTT(**{**{key: value for key, value in cfg.stt.items() if key != "_target_"}, **changes})
    stage.setup()
    stage.warm_up()
    return stage


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    if not espeak_available():
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    folder = tmp_path_factory.mktemp("recognition")
    return [espeak(text, voice, rate, folder / f"{voice}-{rate}-{index}.wav")
            for voice in VOICES for rate in RATES for index, text in enumerate(SENTENCES)]


def share(heard: list[tuple[str, str]]) -> float:
    """The share of the said words found in what was heard, over (said, heard) pairs."""
    found = sum(word in set(words(text)) for said, text in heard for word in words(said))
    return found / sum(len(words(said)) for said, _ in heard)


def heard_share(stage: FasterWhisperSTT, clips) -> tuple[float, list[tuple[str, str]]]:
    """The share of the set's words found in the transcripts, and what each clip was heard as."""
    heard = []
    for index, clip in enumerate(clips):
        [out] = list(stage.process(SpeechSegment(clip.samples, 16000, index, 0.0, 1.0)))
        heard.append((clip.text, out.text if isinstance(out, Transcript) else ""))
    return share(heard), heard


@pytest.fixture(scope="module")
def default_heard(grid):
    """The default's share and transcripts of the set, heard once for the tests that read them (16 s)."""
    return heard_share(default_stt(), grid)


def test_default_stt_hears_espeak_voices_and_rates(default_heard):
    heard_default, heard = default_heard
    assert heard_default >= MIN_WORDS_HEARD, [pair for pair in heard if set(words(pair[0])) - set(words(pair[1]))]
    assert all(text for _, text in heard)  # every clip gives words


def test_packaged_base_hears_espeak_voices_and_rates(grid):
    """stt.model=base (Whisper base, multilingual, the whisper-base extra) heard 86-87 % of the set's words under
    CT2_FORCE_CPU_ISA=AVX and GENERIC, float32 and two threads (python -m s2s.bench recognition): less than
    tiny.en, which is why it is no default; the test holds it to that level with a margin."""
    from s2s.models import package_file
    from s2s.stt.faster_whisper import BASE_PARTS

    if any(package_file(package) is None for package in BASE_PARTS):
        pytest.skip("the whisper-base extra is not installed (pip install 's2s[whisper-base]')")
    heard_base, heard = heard_share(default_stt(model="base"), grid[::2])  # half the set: it is 2.5x slower
    assert heard_base >= MIN_WORDS_HEARD_BASE, [pair for pair in heard if set(words(pair[0])) - set(words(pair[1]))]
    assert sum(1 for _, text in heard if text) >= len(heard) - 1  # words from (nearly) every clip


def balanced_half(clips: list) -> list:
    """Half the set, with every sentence in every voice: three sentences of each voice and rate, the other three
    in the next (``[::2]`` took the same three sentences from every voice and rate, and Whisper's 30 s window
    happened to hear those best: 95 % of their words, 91-93 % of the others')."""
    count = len(SENTENCES)
    return [clip for index, clip in enumerate(clips) if (index + index // count) % 2 == 0]


def test_short_window_hears_as_much_as_the_full_one(grid, default_heard):
    """window_s (the default's 10 s) is chosen for time; on the set it must not hear less than Whisper's 30 s.
    Measured on the balanced half: 30 s 91.0 %, 15 s 93.7 %, 10 s 92.3 % (the whole set: 91.9, 93.7-94.1, 92.8 %)."""
    full, _ = heard_share(default_stt(window_s=None), balanced_half(grid))  # half the set: 2x slower
    short = share(balanced_half(default_heard[1]))
    assert short >= full - 0.03, (short, full)


def test_silence_gives_no_words_and_ends_the_turn():
    out = list(default_stt().process(SpeechSegment(audio.silence(1.5, 16000), 16000, 3, 0.0, 1.5)))
    assert out == [TurnEnd(3)]


class CountedDecodes:
    """CTranslate2's Whisper model, every ``generate`` call's beam size, temperature, samples, window and best
    score noted (the library does the work)."""

    def __init__(self, model):
        self.model, self.beams, self.hotter, self.windows, self.best = model, [], [], [], []

    def generate(self, features, *args, **kwargs):
        self.beams.append(kwargs["beam_size"])
        if "sampling_temperature" in kwargs:
            self.hotter.append((kwargs["sampling_temperature"], kwargs["num_hypotheses"]))
        self.windows.append(features.shape[1])
        [result] = self.model.generate(features, *args, **kwargs)
        tokens = len(result.sequences_ids[0])
        self.best.append(result.scores[0] * tokens / (tokens + 1))
        return [result]

    def __getattr__(self, name):
        return getattr(self.model, name)


@pytest.mark.parametrize(("beam_below", "beams"), [(None, [5]), (-10.0, [1]), (0.0, [1, 5])])
def test_greedy_first_decodes_again_with_beams_only_below_its_confidence(beam_below, beams):
    """stt.beam_below: one greedy decode where it is sure enough (no average log-probability is under -10), a second with
    beam_size beams where it is not (every average is under 0), and beams alone without it."""
    from s2s.resolvers import sample

    stage = default_stt(beam_below=beam_below, cpu_decoder="ctranslate2")  # the decodes the spy counts
    spy = stage._model.model = CountedDecodes(stage._model.model)
    question = audio.read_audio(sample("question.wav"), 16000)
    [out] = list(stage.process(SpeechSegment(question, 16000, 0, 0.0, 2.0)))
    assert spy.beams == beams
    assert set(words("What is the capital of France?")) <= set(words(out.text)), out.text


def reversed_question():
    """The bundled question played backwards: speech-like sound with no words, which tiny.en decodes with an
    average log-probability under faster-whisper's -1 at every temperature (-1.2 to -1.5 measured)."""
    from s2s.resolvers import sample

    return audio.read_audio(sample("question.wav"), 16000)[::-1].copy()


@pytest.mark.parametrize(("retry_s", "most"), [(None, len(HOTTER)), (1e-9, 1), (0.0, 0)])
def test_an_unsure_decode_is_retried_hotter_in_its_own_window_within_retry_s(retry_s, most):
    """stt.retry_s: faster-whisper's temperature fallback (the best of BEST_OF samples at each temperature, in
    order, until one is sure), in the 10 s window the turn was encoded in, never faster-whisper's own 30 s one;
    each retry starts only if it fits the budget (1e-9: the first one alone; 0: none)."""
    stage = default_stt(retry_s=retry_s, cpu_decoder="ctranslate2")
    spy = stage._model.model = CountedDecodes(stage._model.model)
    [out] = list(stage.process(SpeechSegment(reversed_question(), 16000, 0, 0.0, 2.0)))
    assert spy.beams[:2] == [1, 5] and spy.best[1] < LOW_LOGPROB  # greedy, then beams: both unsure
    tried = len(spy.hotter)
    assert spy.hotter == [(temperature, BEST_OF) for temperature in HOTTER[:tried]]
    assert tried == most or retry_s is None and spy.best[-1] >= LOW_LOGPROB  # stopped when one was sure
    assert set(spy.windows) == {10 * 16000 // 160 // 2}  # the encoded 10 s window: 500 frames
    assert isinstance(out, (Transcript, TurnEnd))

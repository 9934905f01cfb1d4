"""Silero VAD (packaged model) as a streaming utterance detector."""
from __future__ import annotations

import time

import numpy as np
import pytest

from s2s import audio
from s2s.messages import AudioChunk, SpeechSegment, SpeechStarted
from s2s.vad.silero import SileroVAD


@pytest.fixture(scope="module")
def two_utterances(espeak, tmp_path_factory):
    folder = tmp_path_factory.mktemp("vad")
    first = audio.read_audio(espeak("Hello there, how are you today?", folder / "a.wav"), 16000)
    second = audio.read_audio(espeak("Tell me a joke please.", folder / "b.wav"), 16000)
    gap = audio.silence(1.5, 16000)
    # between them, more than vad.resume_ms (1.2 s) after the first turn ends: two turns, neither resumed
    return np.concatenate([gap, first, audio.silence(3.0, 16000), second, gap]), (len(first), len(second))


def run_vad(vad: SileroVAD, samples: np.ndarray):
    vad.setup()
    out = []
    for block in audio.chunks(samples, 512):
        out += list(vad.process(AudioChunk(block, 16000)))
    out += list(vad.flush())
    return out


def test_two_utterances_give_two_turns(two_utterances):
    samples, (first, second) = two_utterances
    out = run_vad(SileroVAD(min_silence_ms=500, speculative_silence_ms=None), samples)
    segments = [m for m in out if isinstance(m, SpeechSegment)]
    assert [s.turn for s in segments] == [0, 1]
    assert [m.turn for m in out if isinstance(m, SpeechStarted)] == [0, 1]
    assert segments[0].start_s == pytest.approx(1.5, abs=0.3)
    assert segments[0].duration_s == pytest.approx(first / 16000, abs=0.5)
    assert segments[1].duration_s == pytest.approx(second / 16000, abs=0.5)
    assert out.index(next(m for m in out if isinstance(m, SpeechStarted))) < out.index(segments[0])


def test_long_speech_is_split_never_dropped(two_utterances):
    samples, (first, _) = two_utterances
    out = run_vad(SileroVAD(max_speech_ms=800, speculative_silence_ms=None), samples[: 24000 + first + 24000])
    segments = [m for m in out if isinstance(m, SpeechSegment)]
    assert len(segments) >= 2
    assert all(s.duration_s <= 0.8 + 0.04 for s in segments)
    total = sum(len(s.samples) for s in segments)
    assert total >= first * 0.8  # the pieces together keep (nearly) all of the utterance


def test_silence_and_blips_give_nothing():
    blip = np.zeros(16000 * 2, dtype=np.float32)
    blip[16000:16000 + 800] = 0.5 * np.sin(np.arange(800) / 3)  # 50 ms click
    assert [m for m in run_vad(SileroVAD(), blip) if isinstance(m, SpeechSegment)] == []


def test_reset_starts_turns_again(two_utterances):
    samples, _ = two_utterances
    vad = SileroVAD(speculative_silence_ms=None)
    run_vad(vad, samples)
    vad.reset()
    out = [m for block in audio.chunks(samples, 512) for m in vad.process(AudioChunk(block, 16000))]
    assert [m.turn for m in out if isinstance(m, SpeechSegment)][:1] == [2]  # turn numbers keep increasing


def test_other_input_rates_are_resampled(two_utterances):
    samples, _ = two_utterances
    at_8k = audio.resample(samples, 16000, 8000)
    vad = SileroVAD(speculative_silence_ms=None)
    vad.setup()
    out = [m for block in audio.chunks(at_8k, 256) for m in vad.process(AudioChunk(block, 8000))]
    assert len([m for m in out if isinstance(m, SpeechSegment)]) == 2


def test_onnx_default_matches_torchscript_without_importing_torch(two_utterances):
    """The default (ONNX through onnxruntime) finds the same turns as the TorchScript model, within a frame or two."""
    samples, _ = two_utterances
    segments = {}
    for onnx in (True, False):
        out = run_vad(SileroVAD(min_silence_ms=500, speculative_silence_ms=None, onnx=onnx), samples)
        segments[onnx] = [m for m in out if isinstance(m, SpeechSegment)]
    assert len(segments[True]) == len(segments[False]) == 2
    for a, b in zip(segments[True], segments[False]):
        assert a.start_s == pytest.approx(b.start_s, abs=0.07)
        assert a.speech_end_s == pytest.approx(b.speech_end_s, abs=0.07)
    assert SileroVAD().onnx  # the option file and the signature agree that ONNX is the default


def test_onnx_vad_runs_without_torch(two_utterances, tmp_path):
    """In a fresh process the default VAD finds speech and never imports torch (the default path stays torch-free)."""
    import subprocess
    import sys

    samples, _ = two_utterances
    np.save(tmp_path / "samples.npy", samples)
    code = ("import sys, numpy as np; from s2s import audio; from s2s.messages import AudioChunk, SpeechSegment; "
            "from s2s.vad.silero import SileroVAD; v = SileroVAD(speculative_silence_ms=None); v.setup(); "
            f"s = np.load({str(tmp_path / 'samples.npy')!r}); "
            "out = [m for b in audio.chunks(s, 512) for m in v.process(AudioChunk(b, 16000))] + list(v.flush()); "
            "print(sum(isinstance(m, SpeechSegment) for m in out), 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["2", "False"]


def _last_speculative(samples: np.ndarray, **settings) -> SpeechSegment:
    return [m for m in run_vad(SileroVAD(**settings), samples) if isinstance(m, SpeechSegment) and m.speculative][-1]


def test_quiet_lets_the_work_start_before_silero_hears_silence_unless_the_background_is_loud(two_utterances):
    samples, (first, _) = two_utterances
    one = samples[:24000 + first + 24000]  # 1.5 s of digital silence, the utterance, 1.5 s more
    quiet, silero = _last_speculative(one), _last_speculative(one, quiet_below=None)
    assert silero.closed_s - quiet.closed_s >= 0.03  # espeak's sound stops a frame or more before Silero hears it
    assert quiet.speech_end_s < silero.speech_end_s and quiet.samples.size < silero.samples.size
    # a background over a tenth of the speech's peak: a quiet pause cannot be told from it, so Silero alone
    hiss = np.random.default_rng(0).standard_normal(len(one)).astype(np.float32) * 0.06 * np.abs(one).max()
    noisy = one + hiss
    assert _last_speculative(noisy).closed_s == _last_speculative(noisy, quiet_below=None).closed_s


# ---------------------------------------------------------------- a turn the speaker goes on from (vad.resume_ms)
@pytest.fixture(scope="module")
def halves(espeak, tmp_path_factory):
    """"What is the capital of", a pause, "France?" (and where "France?" begins, s): the silence rule ends a turn
    inside a pause of 1 s."""
    folder = tmp_path_factory.mktemp("halves")
    first, second = (audio.read_audio(espeak(text, folder / f"{index}.wav"), 16000)
                     for index, text in enumerate(["What is the capital of", "France?"]))

    def joined(pause_s: float, *between: np.ndarray) -> tuple[np.ndarray, float]:
        quiet = audio.silence(1.0, 16000)
        head = np.concatenate([quiet, first, audio.silence(pause_s, 16000), *between])
        return np.concatenate([head, second, quiet]), len(np.trim_zeros(head, "b")) / 16000 + pause_s

    return joined


def resuming(barge_in: bool = True, **settings) -> SileroVAD:
    """The VAD as a realtime session runs it, with barge-in: a turn the speaker goes on from may be resumed."""
    vad = SileroVAD(min_silence_ms=500, speculative_silence_ms=None, **settings)
    vad.barge_in = barge_in
    return vad


def _turns(samples: np.ndarray, **settings) -> tuple[list[SpeechSegment], list[int]]:
    out = run_vad(resuming(**settings), samples)
    return [m for m in out if isinstance(m, SpeechSegment)], [m.turn for m in out if isinstance(m, SpeechStarted)]


def test_speech_soon_after_a_turn_ended_resumes_it_and_holds_the_whole(halves):
    (cut, whole), started = _turns(halves(1.0)[0])
    assert cut.resumes is None and whole.resumes == cut.turn == 0 and started == [0, 1]
    assert whole.start_s == cut.start_s  # the words before the pause, the pause, and the words after it
    assert whole.speech_end_s > cut.speech_end_s + 1.0 and len(whole.samples) > len(cut.samples) + 8000
    np.testing.assert_array_equal(whole.samples[:len(cut.samples)], cut.samples)
    assert whole.end_s - whole.start_s > whole.duration_s + 0.5  # the pause was shortened (gap_ms): not the clock
    # off, without barge-in (the reply to the half plays out), or a pause longer than the window: a new turn with
    # only the new words
    for (samples, _), settings in ((halves(1.0), {"resume_ms": None}), (halves(1.0), {"barge_in": False}),
                                   (halves(3.0), {})):
        (_, alone), _ = _turns(samples, **settings)
        assert alone.resumes is None and alone.start_s > cut.speech_end_s + 0.5


def test_a_blip_in_the_window_neither_resumes_nor_starts_a_turn_and_the_window_then_closes(halves, espeak, tmp_path):
    hum = np.trim_zeros(audio.read_audio(espeak("Hm", tmp_path / "hm.wav"), 16000))[:2400]  # 150 ms: Silero hears it
    samples, _ = halves(1.2, hum, audio.silence(2.0, 16000))  # the hum comes inside the window, "France?" after it
    (first, *rest), started = _turns(samples, min_speech_ms=400)
    assert started == [0, 1] and [segment.resumes for segment in rest] == [None]
    assert rest[0].start_s > first.speech_end_s + 2.0  # "France?" alone: the hum was dropped, the window closed


def test_speech_resumed_within_the_window_barges_in_no_sooner_than_a_new_turn(halves):
    samples, _ = halves(1.0)
    heard_at = {}
    for resume_ms in (1200, None):
        vad = resuming(resume_ms=resume_ms)
        vad.setup()
        heard_at[resume_ms] = [index for index, block in enumerate(audio.chunks(samples, 512))
                               for m in vad.process(AudioChunk(block, 16000)) if isinstance(m, SpeechStarted)]
    # the carried words do not count: SpeechStarted (which barges in) waits for min_speech_ms of the new speech
    assert len(heard_at[1200]) == 2 and heard_at[1200] == heard_at[None]


def test_the_window_holds_on_the_wall_clock_too(halves):
    """A client that sends nothing while its user is silent stops the input's clock: speech that comes 1.5 s later
    in time is a turn of its own, however little audio came between."""
    samples, france_s = halves(1.0)
    vad = resuming()
    vad.setup()
    cut = int((france_s - 0.2) * 16000) // 512 * 512  # the turn has ended by then; "France?" not yet begun
    before = [m for block in audio.chunks(samples[:cut], 512) for m in vad.process(AudioChunk(block, 16000))]
    assert [m.turn for m in before if isinstance(m, SpeechSegment)] == [0]
    time.sleep(1.3)
    after = [m for block in audio.chunks(samples[cut:], 512) for m in vad.process(AudioChunk(block, 16000))]
    assert [(m.turn, m.resumes) for m in after if isinstance(m, SpeechSegment)] == [(1, None)]


def test_a_long_pause_inside_an_utterance_is_shortened_for_the_stt_and_the_clock_stays_true(halves):
    samples, france_s = halves(1.0)
    segments = {}
    for gap_ms in (200, None):
        out = run_vad(SileroVAD(min_silence_ms=1500, speculative_silence_ms=None, gap_ms=gap_ms), samples)
        (segments[gap_ms],) = [m for m in out if isinstance(m, SpeechSegment)]  # one turn: the pause is shorter
    kept, whole = segments[200], segments[None]
    assert (kept.start_s, kept.end_s, kept.speech_end_s) == (whole.start_s, whole.end_s, whole.speech_end_s)
    assert whole.duration_s == pytest.approx(whole.end_s - whole.start_s)
    # Silero's silence between the words (the 1 s pause and espeak's own quiet around each piece, after Silero's
    # hangover and before it hears "France?") cut to 256 ms (the pad, 4 frames, each side): most of it went, and
    # every sound is kept
    assert 0.5 <= whole.duration_s - kept.duration_s <= 1.3
    assert np.abs(kept.samples).sum() == pytest.approx(np.abs(whole.samples).sum(), rel=1e-6)

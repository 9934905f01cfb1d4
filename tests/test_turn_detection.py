"""Turn detection (the ``turn`` group): the VAD ends a turn early when its detector hears it complete; the group
binds through ``_target_`` to its settings classes and to nothing else."""
from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import trimmed
from s2s import audio
from s2s.messages import AudioChunk, Metric
from s2s.vad import turn_detection
from s2s.vad.silero import SileroVAD

# judged at pipecat's 0.2 s, under the paused fixture's 0.4 s pause (the default judges later: JUDGE_SILENCE_MS)
SMART = {"_target_": "s2s.vad.turn_detection.SmartTurnSettings", "threshold": 0.5, "max_silence_ms": 1000,
         "judge_silence_ms": 200}
pipecat = pytest.mark.skipif(importlib.util.find_spec("pipecat") is None,
                             reason="pipecat-ai is not installed (pip install --no-deps pipecat-ai==1.14.0)")


class StandIn:
    """A turn detector that answers from a script and keeps what it was asked about."""

    def __init__(self, *answers: bool) -> None:
        self.answers, self.heard = list(answers), []

    def __call__(self, samples: np.ndarray) -> bool:
        self.heard.append(len(samples) / 16000)
        return self.answers.pop(0)


@pytest.fixture(scope="module")
def question(espeak, tmp_path_factory):
    folder = tmp_path_factory.mktemp("turn")
    return trimmed(audio.read_audio(espeak("What is the capital of France?", folder / "q.wav"), 16000))


@pytest.fixture(scope="module")
def paused(espeak, tmp_path_factory):
    """'What is the capital' ... 0.4 s ... 'of France?' then 1.5 s of silence."""
    folder = tmp_path_factory.mktemp("turn_paused")
    first = trimmed(audio.read_audio(espeak("What is the capital", folder / "a.wav"), 16000))
    second = trimmed(audio.read_audio(espeak("of France?", folder / "b.wav"), 16000))
    return np.concatenate([audio.silence(0.5, 16000), first, audio.silence(0.4, 16000), second,
                           audio.silence(1.5, 16000)])


def outputs(vad: SileroVAD, samples: np.ndarray) -> list:
    vad.quiet_below = None  # the judging is timed on Silero's silence; the quiet start: tests/test_real_speech.py
    vad.reset()  # which the quiet setting takes effect at
    vad.setup()
    out = [m for block in audio.chunks(samples, 512) for m in vad.process(AudioChunk(block, 16000))]
    return out + list(vad.flush())


def messages(vad: SileroVAD, samples: np.ndarray) -> list:
    """The turn's events over ``samples``, without the figures the VAD reports to the runner (``Metric``)."""
    return [m for m in outputs(vad, samples) if not isinstance(m, Metric)]


def kinds(out: list) -> list[tuple[str, int]]:
    return [(type(m).__name__, m.turn) for m in out]


def test_a_turn_judged_complete_ends_at_the_short_silence(question):
    samples = np.concatenate([audio.silence(0.5, 16000), question, audio.silence(1.5, 16000)])
    vad = SileroVAD(turn=SMART)
    vad.detector = detector = StandIn(True)
    out = messages(vad, samples)
    assert kinds(out) == [("SpeechStarted", 0), ("SpeechSegment", 0), ("TurnConfirmed", 0)]
    segment, confirmed = out[1], out[2]
    assert segment.speculative
    assert confirmed.at_s - segment.speech_end_s == pytest.approx(0.2, abs=0.07)  # not min_silence_ms (0.6)
    # it judged the whole utterance so far: the speech, the leading pad and the short silence
    assert detector.heard == [pytest.approx(len(question) / 16000 + 0.3, abs=0.15)]


class Slow(StandIn):
    """A detector whose call takes 0.05 s."""

    def __call__(self, samples: np.ndarray) -> bool:
        threading.Event().wait(0.05)
        return super().__call__(samples)


@pytest.mark.parametrize("hear_silence_ms", [200, 400])  # heard beside the VAD, and at the judge silence itself
def test_the_vad_reports_how_long_smart_turn_took_to_hear_each_judged_pause(question, hear_silence_ms):
    """smart_turn_s: the call's wall time, which on busy cores is what the turn's other work lost to it (the latency
    bench prints it beside the chain)."""
    samples = np.concatenate([audio.silence(0.5, 16000), question, audio.silence(1.5, 16000)])
    vad = SileroVAD(turn={**SMART, "judge_silence_ms": 400, "hear_silence_ms": hear_silence_ms})
    vad.detector = Slow(True)
    [metric] = [m for m in outputs(vad, samples) if isinstance(m, Metric)]
    assert (metric.turn, metric.name) == (0, "smart_turn_s") and 0.05 <= metric.value < 1.0


def test_smart_turn_hears_the_pause_beside_the_vad_at_its_silence_and_ends_the_turn_at_the_judge_silence(question):
    """It hears 0.2 s of silence (as pipecat feeds it) in a thread of its own: its verdict is ready at 0.4 s."""
    samples = np.concatenate([audio.silence(0.5, 16000), question, audio.silence(1.5, 16000)])
    vad = SileroVAD(turn={**SMART, "judge_silence_ms": 400, "hear_silence_ms": 200})
    threads = []
    detector = StandIn(True)
    vad.detector = lambda samples: (threads.append(threading.current_thread().name), detector(samples))[1]
    out = messages(vad, samples)
    assert kinds(out) == [("SpeechStarted", 0), ("SpeechSegment", 0), ("TurnConfirmed", 0)]
    assert out[2].at_s - out[1].speech_end_s == pytest.approx(0.4, abs=0.07)
    assert detector.heard == [pytest.approx(len(question) / 16000 + 0.3, abs=0.15)]  # pad, speech, 0.2 s silence
    assert threads == ["s2s-smart-turn"]


def test_a_verdict_heard_on_a_pause_the_user_ends_before_the_judge_silence_is_dropped(paused):
    vad = SileroVAD(turn={**SMART, "judge_silence_ms": 600, "hear_silence_ms": 200})  # the pause is 0.4 s
    vad.detector = detector = StandIn(True, False)
    out = messages(vad, paused)
    assert kinds(out) == [("SpeechStarted", 0), ("SpeechSegment", 0), ("TurnDiscarded", 0), ("SpeechSegment", 1),
                          ("TurnConfirmed", 1)]
    assert out[4].at_s - out[3].speech_end_s == pytest.approx(1.0, abs=0.07)  # the end heard incomplete: the max
    assert len(detector.heard) == 2 and detector.heard[1] > detector.heard[0] + 0.5


def test_a_turn_judged_incomplete_waits_for_the_maximum_silence(question):
    samples = np.concatenate([audio.silence(0.5, 16000), question, audio.silence(1.5, 16000)])
    vad = SileroVAD(turn=SMART)
    vad.detector = StandIn(False)
    out = messages(vad, samples)
    assert kinds(out) == [("SpeechStarted", 0), ("SpeechSegment", 0), ("TurnConfirmed", 0)]
    assert out[2].at_s - out[1].speech_end_s == pytest.approx(1.0, abs=0.07)  # turn.max_silence_ms


def test_the_pause_judged_incomplete_keeps_the_turn_open_and_the_end_judged_complete_closes_it(paused):
    vad = SileroVAD(turn=SMART)
    vad.detector = detector = StandIn(False, True)
    out = messages(vad, paused)
    assert kinds(out) == [("SpeechStarted", 0), ("SpeechSegment", 0), ("TurnDiscarded", 0), ("SpeechSegment", 1),
                          ("TurnConfirmed", 1)]
    whole, confirmed = out[3], out[4]
    assert confirmed.at_s - whole.speech_end_s == pytest.approx(0.2, abs=0.07)
    assert detector.heard[1] > detector.heard[0] + 0.5  # the second judgement hears the whole turn


def test_a_pause_judged_complete_cuts_the_turn_there(paused):
    """What a wrong 'complete' costs: the rest of the sentence becomes a turn of its own."""
    vad = SileroVAD(turn=SMART)
    vad.detector = StandIn(True, True)
    out = messages(vad, paused)
    assert kinds(out) == [("SpeechStarted", 0), ("SpeechSegment", 0), ("TurnConfirmed", 0), ("SpeechStarted", 1),
                          ("SpeechSegment", 1), ("TurnConfirmed", 1)]


def test_turn_silence_is_todays_behaviour(paused):
    """``turn=silence`` (the default) gives exactly the messages the VAD gave without the group."""
    def summary(out):
        return [(type(m).__name__, m.turn, getattr(m, "speech_end_s", None), getattr(m, "at_s", None)) for m in out]

    today = summary(messages(SileroVAD(), paused))
    silence = {"_target_": "s2s.vad.turn_detection.SilenceSettings"}
    assert summary(messages(SileroVAD(turn=silence), paused)) == today
    assert [kind for kind, *_ in today] == ["SpeechStarted", "SpeechSegment", "TurnDiscarded", "SpeechSegment",
                                            "TurnConfirmed"]


# ---------------------------------------------------------------- config
def test_each_turn_option_composes_validates_and_reaches_the_vad(tmp_path):
    """An option file is its settings class's ``_target_`` and exactly that class's keys (bound without a VAD)."""
    from conftest import CONF_DIR, compose_config
    from s2s.config import validate
    from s2s.schema import check_kwargs
    from s2s.config_errors import ValidationContext

    options = sorted(path.stem for path in (CONF_DIR / "turn").glob("*.yaml"))
    assert options == ["fused", "silence", "smart_turn", "words"]
    for option in options:
        cfg = compose_config([f"turn={option}"], tmp_path)
        node = dict(cfg.turn)
        cls = turn_detection.TARGETS[node.pop("_target_")]
        assert check_kwargs(cls, node, ValidationContext("turn", "linux", "linux", "cpu", {})) == []
        if option in ("smart_turn", "fused") and importlib.util.find_spec("pipecat") is None:
            continue
        spec = next(s for s in validate(cfg) if s.group == "vad")
        assert type(spec.build()._turn_settings) is cls
    default = compose_config([], tmp_path).turn._target_  # measured on real pauses: python -m s2s.bench turns
    assert default == "s2s.vad.turn_detection.FusedSettings"


@pytest.mark.parametrize("override,expected", [
    ("turn.threshold=1.0", "turn.threshold=1.0: invalid; expected a number from 0 to 1 (exclusive)"),
    ("turn.max_silence_ms=20000", "turn.max_silence_ms=20000: invalid; expected a number from 300 to 10000"),
    ("turn._target_=s2s.vad.turn_detection.Semantic",
     "turn._target_=s2s.vad.turn_detection.Semantic: invalid; expected one of s2s.vad.turn_detection.SilenceSettings"),
    ("+turn.detector=words", "turn.detector=words: invalid; expected a known key"),
    ("vad.speculative_silence_ms=null", "vad.speculative_silence_ms=None: invalid; expected a silence in ms"),
    ("turn.judge_silence_ms=10", "turn.judge_silence_ms=10: invalid; expected a number from 32 to 10000"),
])
@pytest.mark.parametrize("option", ["smart_turn", "words"])
def test_bad_turn_settings_are_refused_before_loading(option, override, expected, tmp_path):
    from conftest import compose_config
    from s2s.config import validate
    from s2s.config_errors import ConfigErrors

    with pytest.raises(ConfigErrors) as caught:
        validate(compose_config([f"turn={option}", override], tmp_path))
    assert any(str(error).startswith(expected) for error in caught.value.errors), caught.value


def test_max_silence_must_outlast_the_judging_silence(tmp_path):
    from conftest import compose_config
    from s2s.config import validate
    from s2s.config_errors import ConfigErrors

    with pytest.raises(ConfigErrors, match=r"turn.max_silence_ms=400: invalid; expected more than vad.spec"):
        validate(compose_config(["turn=smart_turn", "turn.max_silence_ms=400", "vad.speculative_silence_ms=500",
                                 "vad.min_silence_ms=600"], tmp_path))
    with pytest.raises(ConfigErrors, match=r"turn.max_silence_ms=1400: invalid; expected more than "
                                           r"turn.judge_silence_ms \(1500\)"):
        validate(compose_config(["turn=words", "turn.judge_silence_ms=1500"], tmp_path))


ALL_FOUR = ", ".join(f"s2s.vad.turn_detection.{kind}Settings" for kind in ("Silence", "SmartTurn", "Words", "Fused"))


@pytest.mark.parametrize("target,expected", [
    ("pathlib.Path.touch", "a class inside the 's2s' package"),  # the allowlist: nothing outside s2s, anywhere
    ("s2s.tts.piper.PiperTTS", f"one of {ALL_FOUR}"),  # the turn group's own: one of its four settings classes
])
def test_a_foreign_turn_target_is_refused_before_anything_is_built(target, expected, tmp_path, monkeypatch, capsys):
    from conftest import compose_config
    from s2s import app, job

    ran = []
    monkeypatch.setattr(app, "run_once", lambda *args: ran.append(args) or 0)
    touched = tmp_path / "touched"
    cfg = compose_config(["turn=fused", f"turn._target_={target}", f"+turn.self={touched}"], tmp_path)
    assert job.run(cfg) == 2 and ran == [] and not touched.exists()
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"config error: turn._target_={target}: invalid; expected {expected}"), line
    with pytest.raises(ValueError, match=rf"turn._target_={target}: expected one of {ALL_FOUR}"):
        SileroVAD(turn={"_target_": target})  # a program's mapping: only the four are ever built from it


def test_on_the_command_line_a_foreign_turn_target_is_one_line_and_never_called(tmp_path):
    from conftest import run_cli

    touched = tmp_path / "touched"
    result = run_cli("turn._target_=pathlib.Path.touch", f"+turn.self={touched}", "dry_run=true", cwd=tmp_path)
    assert result.returncode == 2 and not touched.exists()
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("config error: turn._target_=pathlib.Path.touch: invalid; expected a class inside the "
                           "'s2s' package"), line


def test_without_pipecat_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    from conftest import compose_config
    from s2s.config import validate
    from s2s.config_errors import ConfigErrors
    from s2s.stage import MissingExtraError

    monkeypatch.setattr(turn_detection, "MODEL_FILE", ("s2s_no_such_package", "model.onnx"))
    with pytest.raises(ConfigErrors, match=r"turn._target_=s2s.vad.turn_detection.SmartTurnSettings: .*pip install "
                                           r"--no-deps pipecat-ai==1\.14\.0"):
        validate(compose_config(["turn=smart_turn"], tmp_path))
    with pytest.raises(MissingExtraError, match=r"scripts/setup.sh"):
        SileroVAD(turn=SMART).setup()


# ---------------------------------------------------------------- the real model
@pipecat
def test_log_mel_matches_pipecats_feature_code(question):
    path = Path(importlib.util.find_spec("pipecat").submodule_search_locations[0]) / "audio" / "turn" / \
        "smart_turn" / "_whisper_features.py"
    spec = importlib.util.spec_from_file_location("pipecat_whisper_features", path)  # numpy only, no pipecat import
    features = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(features)
    for clip in (question, np.tile(question, 6)):  # shorter and longer than the 8 s window
        window = clip[-128000:]
        reference = features.compute_whisper_log_mel_features(np.pad(window, (128000 - len(window), 0)))
        np.testing.assert_allclose(turn_detection.log_mel(clip), reference, atol=1e-4)


COMPLETE = ["What is the capital of France?", "Tell me a joke please.", "Thank you very much."]
CUT = ["I would like to", "Could you tell me about the", "What I want to know is"]
VOICES = [("en-us", 150), ("en-gb", 165), ("en-us+f3", 140), ("en-gb+m3", 155)]


@pipecat
def test_smart_turn_hears_complete_questions_from_cut_ones(tmp_path):
    """Over 4 espeak voices, complete sentences score far above ones cut after a function word."""
    import onnxruntime

    from s2s.bench.speech import espeak, espeak_available

    if not espeak_available():
        pytest.skip("espeak-ng is not installed")
    detector = turn_detection.SmartTurn(onnxruntime, 1, 0.5)

    def scores(texts):
        found = []
        for text in texts:
            for voice, rate in VOICES:
                speech = trimmed(espeak(text, voice, rate, tmp_path / "x.wav").samples)
                found.append(detector.probability(np.concatenate([audio.silence(0.1, 16000), speech,
                                                                  audio.silence(0.2, 16000)])))
        return np.array(found)

    complete, cut = scores(COMPLETE), scores(CUT)
    assert complete.mean() - cut.mean() > 0.4, (complete, cut)  # measured: 0.90 against 0.16
    assert (complete >= 0.5).sum() >= 10 and (cut < 0.5).sum() >= 9, (complete, cut)  # measured 12/12, 11/12


# ---------------------------------------------------------------- python -m s2s.bench turns
def test_the_turn_benchmark_counts_a_turn_let_go_in_the_pause_as_a_cut_off(paused):
    from s2s.bench.turns import TurnClip, judge

    loud = np.flatnonzero(np.abs(paused) > 0.02)
    widest = int(np.argmax(np.diff(loud)))  # the 0.4 s pause between the pieces
    clip = TurnClip("paused", paused, (loud[widest] / 16000, loud[widest + 1] / 16000))
    for answers, cut, turns in (((True, True), True, 2), ((False, True), False, 1)):
        vad = SileroVAD(turn=SMART, quiet_below=None)  # the endpoint from Silero's end of speech
        vad.detector = StandIn(*answers)
        vad.setup()
        result = judge(vad, clip)
        assert (result["cut"], result["turns"]) == (cut, turns)
        assert result["endpoint_s"] == pytest.approx(0.2, abs=0.07)


def test_the_turn_benchmark_counts_a_question_let_go_before_its_last_sentence_as_split(tmp_path):
    from s2s.bench.turns import SENTENCES, build_sentence_set, judge

    clips = build_sentence_set(tmp_path)
    assert len(clips) >= 3 * len(SENTENCES)  # espeak pauses between the sentences in (nearly) every voice
    for clip in clips[:len(SENTENCES)]:
        for done, split in ((True, True), (False, False)):  # judged at 0.2 s, under espeak's sentence pauses
            vad = SileroVAD(turn=SMART)
            vad.detector = lambda samples, done=done: done
            vad.setup()
            result = judge(vad, clip)
            assert (result["cut"], result["turns"] > 1) == (split, split), clip.name

"""Turn detection for the VAD: how a pause ends the user's turn (the ``turn`` config group).

``turn=silence``: a silence of ``vad.min_silence_ms`` ends it. The others judge the turn once, at a short
silence (``turn.judge_silence_ms``; the work on a speculative turn starts sooner, at ``vad.speculative_silence_ms``,
so the reply is being made while they wait): ``turn=smart_turn`` from the audio, with
Smart Turn v3.2 (the reference system's endpointing model, an 8.7 MB ONNX file inside the ``pipecat-ai`` wheel,
BSD-2-Clause); ``turn=words`` from the words, with the LLM's verdict; ``turn=fused`` (the default) from both.
A turn judged complete ends at once; one judged incomplete waits up to ``turn.max_silence_ms``.

Each option file of the group is ``_target_`` (one of the settings classes below) plus exactly its keyword
arguments, like every other option file. The VAD receives the group as a plain mapping (``vad.turn: ${turn}``)
and :func:`settings` builds its ``_target_`` only when it is one of :data:`TARGETS`: nothing else is ever
instantiated from it, whatever the config names.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from s2s.config_errors import ConfigError, Range, ValidationContext
from s2s.models import package_file
from s2s.stage import MissingExtraError

RATE = 16000
WINDOW_S = 8  # the model hears the last 8 s of the turn, zero-padded in front when shorter
MODEL_FILE = ("pipecat", "audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")
INSTALL = "pip install --no-deps pipecat-ai==1.14.0 (scripts/setup.sh does it)"
BACKEND = "turn=smart_turn"


# The silence at which a judging detector judges a pause. A finished sentence is often not the end of the turn
# ("All cats are mammals. Tom is a cat. Is the argument valid?"), and both models say done after it: only the
# silence tells the pause between sentences from the end. espeak-ng leaves 0.29-0.38 s of Silero silence between
# sentences at 150-170 words a minute; at 200 ms (pipecat's) the default split that Big Bench Audio question.
# 400 ms costs 0.06 s of median voice-to-voice on real recordings (the reply's work, begun at
# vad.speculative_silence_ms, is mostly not ready sooner): python -m s2s.bench latency with --versus.
# Shorter judging also cut off more mid-sentence pauses on the turn bench (128 and 160 ms: 2 of 23 real ones).
# It counts Silero's silence, though the work starts on quiet sooner (vad.quiet_below): judged on the quiet, real
# recordings were answered at p50 0.47-0.49 s against 0.53-0.54 s, but 3 of 24 espeak questions of several
# sentences were split against 1, Big Bench Audio's "Fidel lies. ..." among them (at 450 ms: 1 of 24, p50 0.52 s).
JUDGE_SILENCE_MS = 400
PauseSilence = Annotated[int, Range(32, 10000)]  # a silence inside the pause: judge_silence_ms, hear_silence_ms
# The silence Smart Turn hears the pause with, in the background: its verdict is ready at the judge silence.
# Pipecat runs the model when its VAD has heard 0.2 s of silence (stop_secs), with that silence in the audio: the
# model's authors feed it so. Heard at the judge silence instead, the call (40 ms on an idle core) came while the
# reply's first chunk was being made, and held the turn's end 0.10-0.15 s past 400 ms on real recordings.
HEAR_SILENCE_MS = 200


def words_probability(words: float, sentence_end: float | None) -> float:
    """The words' end-of-turn probability (the LLM's, on the transcript) weighed with the STT's probability that
    they end a sentence, heard with the audio (:class:`~s2s.messages.SentenceEnd`; None: the words alone).

    The STT's even chance (0.5) leaves the words' probability as it is; a sure end doubles it, and speech that
    trails off takes it to nearly nothing. SmolLM2 reads the words alone: it scored finished statements 0.15-0.2
    where a list could go on ("Eight of spades, four of clubs, seven of hearts"), which Whisper heard end at
    0.85-0.95; Whisper alone hears espeak-ng's flat halves end ("What should I cook"), which SmolLM2 does not.
    Off by default (``turn.sentence_end``): on the turn bench it took the complete turns' endpoint p90 from 0.85 to
    0.61 s but cut one more real pause ("Go forward ... ten meters"), and its decode beside the reply's first
    tokens cost 0.02 s of median voice-to-voice on two cores (README, Turn detection).
    """
    return words if sentence_end is None else min(1.0, 2.0 * words * sentence_end)


class SilenceSettings:
    """``turn=silence``: the turn ends after ``vad.min_silence_ms`` of silence, whatever was said."""

    def __init__(self) -> None:
        pass


class SmartTurnSettings:
    """``turn=smart_turn``'s keys (the VAD builds :class:`SmartTurn` from them in its ``setup``).

    Args:
        threshold: completion probability at or above which a pause ends the turn at once.
        max_silence_ms: the silence that ends a turn the model judged incomplete (it replaces
            ``vad.min_silence_ms``, which only ``turn=silence`` reads).
        judge_silence_ms: the silence at which the model's verdict ends the pause (:data:`JUDGE_SILENCE_MS`).
        hear_silence_ms: the silence the model hears the pause with (:data:`HEAR_SILENCE_MS`; a shorter
            ``judge_silence_ms`` hears at its own).
    """

    def __init__(self, threshold: Annotated[float, Range(0, 1, exclusive=True)] = 0.5,
                 max_silence_ms: Annotated[int, Range(300, 10000)] = 3000,
                 judge_silence_ms: PauseSilence = JUDGE_SILENCE_MS,
                 hear_silence_ms: PauseSilence = HEAR_SILENCE_MS) -> None:
        self.threshold, self.max_silence_ms, self.judge_silence_ms = threshold, max_silence_ms, judge_silence_ms
        self.hear_silence_ms = hear_silence_ms


class WordsSettings:
    """``turn=words``: the LLM reads the speculative turn's transcript and says how likely the words end it.

    The LLM stage yields a :class:`~s2s.messages.TurnVerdict` (its chat model's probability that the words end
    there, :meth:`~s2s.llm.ctranslate2_lm.CTranslate2LM.end_of_turn_probability`) before it starts the speculative
    reply, and the runner hands it back to the VAD: at or above ``threshold`` the still-silent turn ends at once;
    below it, or with no verdict (an LLM that cannot score), the turn ends after ``max_silence_ms`` of silence,
    unless the user goes on.

    Args:
        threshold: the probability at or above which the turn ends at once. On the turn bench's real recordings
            finished statements scored 0.14-0.66 and the first halves of paused sentences mostly under 0.05, but
            halves that are sentences themselves ("Go forward", "... just before I tipped over onto its top")
            0.16-0.42: 0.25 cut 1 of 23 real pauses with instant verdicts, 0.2 cut 4.
        max_silence_ms: the silence that ends a turn whose words look unfinished: longer than a 1.2 s pause,
            within the 1.5 s a finished turn may wait.
        judge_silence_ms: the silence from which a verdict of done ends the turn (:data:`JUDGE_SILENCE_MS`).
        sentence_end: weigh the words' probability with the STT's that they end a sentence, heard with the audio
            (:func:`words_probability`; ``stt=faster_whisper`` makes it, other backends do not).
    """

    def __init__(self, threshold: Annotated[float, Range(0, 1, exclusive=True)] = 0.25,
                 max_silence_ms: Annotated[int, Range(300, 10000)] = 1400,
                 judge_silence_ms: PauseSilence = JUDGE_SILENCE_MS, sentence_end: bool = False) -> None:
        self.threshold, self.max_silence_ms, self.judge_silence_ms = threshold, max_silence_ms, judge_silence_ms
        self.sentence_end = sentence_end


class FusedSettings:
    """``turn=fused``: Smart Turn hears the audio, the LLM reads the words; from the judge silence the turn
    ends at once when both say done, after ``words_done_ms`` of silence when only the words do, and otherwise
    (the words unfinished, or no verdict) after ``max_silence_ms``. Where Smart Turn is sure (``sure_threshold``),
    the words count as done from ``sure_words_threshold``.

    Args:
        threshold: Smart Turn's completion probability that counts as done.
        words_threshold: the words' end-of-turn probability that counts as done (see :class:`WordsSettings`).
        max_silence_ms: the silence that ends a turn whose words are judged unfinished.
        words_done_ms: the silence that ends a turn whose words are done but whose audio Smart Turn judged
            unfinished (it misjudges espeak and many complete real statements); null: ``max_silence_ms``.
        judge_silence_ms: the silence from which both saying done ends the turn (:data:`JUDGE_SILENCE_MS`).
        hear_silence_ms: the silence Smart Turn hears the pause with (:data:`HEAR_SILENCE_MS`; a shorter
            ``judge_silence_ms`` hears at its own).
        sentence_end: weigh the words' probability with the STT's that they end a sentence (see
            :class:`WordsSettings`).
        sure_threshold: Smart Turn's probability at or above which the words need only ``sure_words_threshold``
            (long finished statements the words' model thinks could go on: "... behind the curtain on the left"
            0.09, where " side" may follow); null: ``words_threshold`` always.
        sure_words_threshold: the words' probability that counts as done where Smart Turn is sure.
    """

    def __init__(self, threshold: Annotated[float, Range(0, 1, exclusive=True)] = 0.5,
                 words_threshold: Annotated[float, Range(0, 1, exclusive=True)] = 0.25,
                 max_silence_ms: Annotated[int, Range(300, 10000)] = 1400,
                 words_done_ms: Annotated[int, Range(100, 10000)] | None = 600,
                 judge_silence_ms: PauseSilence = JUDGE_SILENCE_MS,
                 hear_silence_ms: PauseSilence = HEAR_SILENCE_MS, sentence_end: bool = False,
                 sure_threshold: Annotated[float, Range(0, 1, exclusive=True)] | None = 0.95,
                 sure_words_threshold: Annotated[float, Range(0, 1, exclusive=True)] = 0.08) -> None:
        self.sure_threshold, self.sure_words_threshold = sure_threshold, sure_words_threshold
        self.threshold, self.words_threshold, self.max_silence_ms = threshold, words_threshold, max_silence_ms
        self.words_done_ms, self.judge_silence_ms, self.hear_silence_ms = words_done_ms, judge_silence_ms, \
            hear_silence_ms
        self.sentence_end = sentence_end


KINDS = (SilenceSettings, SmartTurnSettings, WordsSettings, FusedSettings)
TARGETS: dict[str, type] = {f"{kind.__module__}.{kind.__name__}": kind for kind in KINDS}  # the only ones built
JUDGES = (SmartTurnSettings, WordsSettings, FusedSettings)  # the kinds that judge the pause (judge_silence_ms)
HEARS = (SmartTurnSettings, FusedSettings)  # ... with Smart Turn on the audio
READS = (WordsSettings, FusedSettings)  # ... with the LLM's verdict on the words
Settings = SilenceSettings | SmartTurnSettings | WordsSettings | FusedSettings


def model_path() -> Path:
    """Smart Turn v3.2's CPU ONNX inside the installed ``pipecat-ai`` wheel, found without importing pipecat."""
    path = package_file(*MODEL_FILE)
    if path is None or not path.is_file():
        raise MissingExtraError(BACKEND, "pipecat", None, install=INSTALL)
    return path


def settings(turn: Mapping[str, Any] | None) -> Settings:
    """The ``turn`` mapping's settings: its ``_target_`` built with its other keys (checked by :func:`check`).

    None is ``turn=silence``. A ``_target_`` outside :data:`TARGETS` raises ValueError: the mapping may come
    from a program rather than a checked config, and nothing but these classes is built from it.
    """
    if turn is None:
        return SilenceSettings()
    values = dict(turn)
    target = values.pop("_target_", None)
    if not isinstance(target, str) or target not in TARGETS:
        raise ValueError(f"turn._target_={target}: expected one of {', '.join(TARGETS)}")
    return TARGETS[target](**values)


def check(turn: Mapping[str, Any] | None, vad: Mapping[str, Any], context: ValidationContext) -> list[ConfigError]:
    """What is wrong with the ``turn`` group (errors named ``turn.<key>``) and with the VAD keys it needs."""
    from dataclasses import replace

    from s2s.schema import check_kwargs

    if turn is None:
        return []
    group = replace(context, group="turn")
    kwargs = dict(turn)
    target = kwargs.pop("_target_", "<missing>")
    if not isinstance(target, str) or target not in TARGETS:
        return [group.error("_target_", target, f"one of {', '.join(TARGETS)} (the options of conf/turn/)")]
    if errors := check_kwargs(TARGETS[target], kwargs, group):
        return errors
    made = TARGETS[target](**kwargs)
    if not isinstance(made, JUDGES):
        return []
    speculative = vad["speculative_silence_ms"]
    if speculative is None:
        errors.append(context.error("speculative_silence_ms", None, f"a silence in ms ({target.rsplit('.', 1)[-1]} "
                                                                    "judges the turn's words after it), e.g. 64"))
    elif made.max_silence_ms <= max(speculative, made.judge_silence_ms):
        name, value = (("vad.speculative_silence_ms", speculative) if speculative > made.judge_silence_ms
                       else ("turn.judge_silence_ms", made.judge_silence_ms))
        errors.append(group.error("max_silence_ms", made.max_silence_ms, f"more than {name} ({value})"))
    if isinstance(made, SmartTurnSettings) and not smart_turn_installed():  # fused judges by the words alone
        errors.append(group.error("_target_", target, f"pipecat-ai installed for its model file ({INSTALL})"))
    return errors


def smart_turn_installed() -> bool:
    """Smart Turn's model file is there (``pipecat-ai`` installed)."""
    try:
        model_path()
    except MissingExtraError:
        return False
    return True


# ------------------------------------------------------------------ Whisper's log-mel features, in numpy
def _mel_filters(bins: int = 80, n_fft: int = 400) -> np.ndarray:
    """Slaney-scale triangular filters with Slaney area normalisation, as Whisper's (librosa's) are."""
    def to_hz(mels: np.ndarray) -> np.ndarray:
        return np.where(mels < 15.0, 200.0 * mels / 3.0, 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels - 15.0)))

    top = 15.0 + np.log(RATE / 2 / 1000.0) * 27.0 / np.log(6.4)  # 8 kHz on the Slaney mel scale
    edges = to_hz(np.linspace(0.0, top, bins + 2))
    ramps = edges[:, None] - np.linspace(0, RATE // 2, n_fft // 2 + 1)[None, :]
    lower = -ramps[:-2] / np.diff(edges)[:-1, None]
    upper = ramps[2:] / np.diff(edges)[1:, None]
    return np.maximum(0.0, np.minimum(lower, upper)) * (2.0 / (edges[2:] - edges[:-2]))[:, None]


_FILTERS = _mel_filters()
_HANN = np.hanning(401)[:-1]


def log_mel(samples: np.ndarray) -> np.ndarray:
    """Smart Turn's input: the last ``WINDOW_S`` seconds (zeros in front), normalised, as 80 x 800 log-mel.

    Matches ``WhisperFeatureExtractor(chunk_length=8)`` with ``do_normalize=True``, which pipecat vendors in
    ``pipecat/audio/turn/smart_turn/_whisper_features.py`` (checked against it in tests/test_turn_detection.py).
    """
    size = WINDOW_S * RATE
    x = np.asarray(samples, dtype=np.float32)[-size:]
    x = np.pad(x, (size - len(x), 0))
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x.astype(np.float64), 200, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, 400)[::160]
    power = np.abs(np.fft.rfft(frames * _HANN, axis=-1)) ** 2
    mel = np.log10(np.maximum(1e-10, _FILTERS @ power.T))[:, :-1]
    return ((np.maximum(mel, mel.max() - 8.0) + 4.0) / 4.0).astype(np.float32)


class SmartTurn:
    """Smart Turn v3.2 through onnxruntime: ``detector(samples)`` is True when the turn sounds complete.

    Args:
        onnxruntime: the imported module.
        threads: the VAD's thread budget (None: one, as pipecat runs it; 30 ms a call on one core).
        threshold: completion probability at or above which the turn is complete.
    """

    def __init__(self, onnxruntime: Any, threads: int | None, threshold: float) -> None:
        from s2s.onnx import cpu_session

        self.threshold = threshold
        self._session = cpu_session(onnxruntime, model_path(), threads or 1)
        self.last_probability: float | None = None

    def probability(self, samples: np.ndarray) -> float:
        """The model's probability that the turn in ``samples`` (16 kHz, up to now) is complete."""
        [out] = self._session.run(None, {"input_features": log_mel(samples)[None]})
        return float(np.asarray(out).reshape(-1)[0])

    def __call__(self, samples: np.ndarray) -> bool:
        self.last_probability = self.probability(samples)
        return self.last_probability >= self.threshold

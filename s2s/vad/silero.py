"""Silero VAD (the model ships inside the silero-vad wheel) as a streaming utterance detector with speculative turns."""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import numpy as np

from s2s import audio
from s2s.aside import Aside
from s2s.config_errors import ConfigErrors, Range, ValidationContext
from s2s.messages import (AudioChunk, Control, Data, Message, Metric, SpeechSegment, SpeechSoFar, SpeechStarted,
                          SentenceEnd, TurnConfirmed, TurnDiscarded, TurnVerdict)
from s2s.stage import Stage, require
from s2s.vad import turn_detection
from s2s.vad.quiet import Quiet
from s2s.vad.resume import Resumable, Resumed, shorten_pause
from s2s.vad.silero_models import RATE, OnnxSilero, TorchSilero

log = logging.getLogger(__name__)

FRAME = 512  # Silero's step at 16 kHz (32 ms)
PROGRESS_FRAMES = 4  # while the user speaks, the utterance so far goes to an STT that asks for it this often
SILENT = np.zeros(FRAME, np.float32)  # a frame of silence (never written)


def _samples(ms: int) -> int:
    return ms * RATE // 1000


class SileroVAD(Stage):
    """Emits one :class:`SpeechSegment` per utterance, and :class:`SpeechStarted` once it is long enough.

    With ``speculative_silence_ms``, the segment goes out after that short silence, marked speculative, so
    STT, LLM and TTS start early; once the silence reaches ``min_silence_ms`` a :class:`TurnConfirmed`
    follows and the runner lets the reply reach the user. If the user speaks again first, a
    :class:`TurnDiscarded` drops that work and the utterance goes on as a new turn holding all of it.

    When the next stage asks for it (an STT decoding incrementally), the utterance so far goes out as a
    :class:`SpeechSoFar` every ``PROGRESS_FRAMES`` frames while the user speaks, and once more when a pause
    begins (:meth:`_pause_pass`): that one is as long as the segment will be if the pause lasts.

    Args:
        threshold: speech probability that opens an utterance; it closes below ``threshold - 0.15``.
        min_silence_ms: silence that ends an utterance (the turn is confirmed).
        speculative_silence_ms: a shorter silence after which work on the turn starts; null = off. 64 ms, not
            200, took 0.05 s off voice-to-voice on real recordings, the judging left at 200 ms.
        min_speech_ms: shorter blips are dropped.
        speech_pad_ms: audio kept before the start and after the end of speech.
        quiet_below: a frame with no sample above this share of the utterance's peak (nor above six times the
            background's level, :func:`s2s.audio.sound_level`) is quiet, and ``speculative_silence_ms`` of quiet
            also starts the work: Silero goes on hearing speech for 0.03-0.3 s after real people's last word.
            Only the work starts sooner: the pause is judged, and the turn ends, on Silero's silence (judged on
            the quiet, more questions of several sentences were split). null: Silero's silence alone.
        max_speech_ms: longer speech is split into consecutive segments (never dropped); null = no limit.
        resume_ms: speech that starts again this soon after a turn ended (its reply may have begun) continues it
            (:mod:`s2s.vad.resume`), with barge-in: its reply is dropped and the whole is answered; null: never.
        gap_ms: Silero's silence inside an utterance is kept up to this much (at least ``speech_pad_ms`` after the
            words and before the next; :mod:`s2s.vad.resume`): the STT hears a sentence whole; null: all of it.
        onnx: run the packaged ONNX export through onnxruntime (the default: no torch in the process, 0.1 ms a
            frame); false: the TorchScript model through torch.
        turn: the ``turn`` group (``${turn}``: its ``_target_``, one of the settings classes of
            :mod:`s2s.vad.turn_detection`, and that class's keys): how a pause ends the turn; null:
            ``turn=silence``, by ``min_silence_ms``. The others judge at their ``judge_silence_ms`` (or at
            ``speculative_silence_ms`` if later).
    """

    accepts = (AudioChunk,)
    emits = (SpeechSegment, SpeechSoFar)

    def __init__(self, threshold: Annotated[float, Range(0, 1, exclusive=True)] = 0.5,
                 min_silence_ms: Annotated[int, Range(32, 10000)] = 600,
                 speculative_silence_ms: Annotated[int, Range(32, 10000)] | None = 64,
                 min_speech_ms: Annotated[int, Range(0, 10000)] = 250,
                 speech_pad_ms: Annotated[int, Range(0, 2000)] = 100,
                 quiet_below: Annotated[float, Range(0, 1, exclusive=True)] | None = 0.02,
                 max_speech_ms: Annotated[int, Range(500, 3600000)] | None = None, onnx: bool = True,
                 turn: dict[str, Any] | None = None,
                 resume_ms: Annotated[int, Range(100, 10000)] | None = 1200,
                 gap_ms: Annotated[int, Range(0, 10000)] | None = 200) -> None:
        self.threshold = threshold
        self.min_silence = _samples(min_silence_ms)
        self.speculative_silence = _samples(speculative_silence_ms) if speculative_silence_ms else None
        self.min_speech = _samples(min_speech_ms)
        self.pad_frames = max(1, -(-_samples(speech_pad_ms) // FRAME)) if speech_pad_ms else 0
        self.max_speech = _samples(max_speech_ms) if max_speech_ms else None
        self.quiet_below = quiet_below
        self.resume_ms = resume_ms
        self.gap_ms = gap_ms
        gap = _samples(gap_ms) // FRAME if gap_ms is not None else None
        # the frames of a pause kept: after the words, before the next (each at least the pad)
        self._gap = None if gap is None else (max(gap // 2, self.pad_frames), max(gap - gap // 2, self.pad_frames))
        self.onnx = onnx
        self.turn = turn
        self._turn_settings = turn_detection.settings(turn)
        judged = isinstance(self._turn_settings, turn_detection.JUDGES)
        # the silence that ends a turn: with Smart Turn or words, one judged incomplete (a complete one ends earlier)
        self._end_silence = _samples(self._turn_settings.max_silence_ms if judged else min_silence_ms)
        # ... and the silence at which they judge it: the work may have started sooner, never later
        self._judge_silence = max(_samples(self._turn_settings.judge_silence_ms) if judged else 0,
                                  self.speculative_silence or 0)
        # ... and Smart Turn hears it sooner, in the background, so that its verdict is ready then
        hears = isinstance(self._turn_settings, turn_detection.HEARS)
        self._hear_silence = min(_samples(self._turn_settings.hear_silence_ms), self._judge_silence) if hears \
            else None
        # turn=words: the LLM's verdict on the speculative turn's words comes back here (``steer``), and the STT's
        # probability that they end a sentence, which weighs it
        words = isinstance(self._turn_settings, turn_detection.READS)
        self.takes: tuple[type[Control], ...] = ((TurnVerdict, SentenceEnd) if self._turn_settings.sentence_end
                                                  else (TurnVerdict,)) if words else ()
        self._fused = isinstance(self._turn_settings, turn_detection.FusedSettings)
        # the turn detector: called on the open turn's samples at the speculative silence, True ends it there;
        # setup() builds Smart Turn for turn=smart_turn unless one was set (tests set a stand-in)
        self.detector: Callable[[np.ndarray], bool] | None = None
        self._model: OnnxSilero | TorchSilero | None = None
        self._turn = 0
        self.reset()

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        max_speech, min_speech = kwargs["max_speech_ms"], kwargs["min_speech_ms"]
        if max_speech is not None and max_speech <= min_speech:
            raise context.error("max_speech_ms", max_speech, f"null or more than min_speech_ms ({min_speech})")
        speculative, min_silence = kwargs["speculative_silence_ms"], kwargs["min_silence_ms"]
        if speculative is not None and speculative >= min_silence:
            raise context.error("speculative_silence_ms", speculative,
                                f"null or less than min_silence_ms ({min_silence}): it starts work before the "
                                f"turn is confirmed")
        if errors := turn_detection.check(kwargs["turn"], kwargs, context):
            raise ConfigErrors(errors)

    def setup(self) -> None:
        if self._fused and self.detector is None and not turn_detection.smart_turn_installed():
            log.warning("turn=fused: Smart Turn's model file is not installed (%s); the words alone judge each "
                        "pause, as turn=words does", turn_detection.INSTALL)
        elif isinstance(self._turn_settings, turn_detection.HEARS) and self.detector is None:
            self.detector = turn_detection.SmartTurn(require("onnxruntime", backend="turn=smart_turn", extra=None),
                                                      self.threads, self._turn_settings.threshold)
        if self.onnx:
            self._model = OnnxSilero(require("onnxruntime", backend="vad=silero", extra=None), self.threads)
            return
        self._model = TorchSilero()

    def reset(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)
        self._ring: deque[np.ndarray] = deque(maxlen=self.pad_frames or 1)
        self._speech: list[np.ndarray] = []
        self._triggered = False
        self._silence = 0  # samples of silence since the last speech frame
        self._started_sent = False
        self._speculated = False  # a speculative segment of the open turn is out
        self._judged = False  # the open speculative turn's pause was judged (at the judge silence)
        self._verdict: float | None = None  # the words' verdict on it (the LLM's)
        self._sentence_end: float | None = None  # ... and the STT's on their sentence end
        self._heard_done = False  # turn=fused: Smart Turn heard the open speculative turn complete
        self._heard_sure = False  # ... with at least turn.sure_threshold
        self._hearing: Aside | None = None  # Smart Turn hearing the open pause, in the background
        self._words_done: int | None = None  # turn=fused: the words said done, the audio not: this silence ends it
        self._position = 0  # samples consumed so far
        self._segment_start = 0
        self._quiet = Quiet(self.quiet_below)  # the quiet at the open utterance's end
        self._early = False  # the open speculative turn began on quiet alone, before Silero heard the silence
        self._resume = Resumable(_samples(self.resume_ms or 0), RATE)  # the turn that just ended, while it may go on
        self._resumes: int | None = None  # the ended turn the open utterance goes on from
        self._carried = 0  # samples of the open utterance carried over from that turn (its words and the gap)
        self._shortened = 0  # frames its pauses lost (gap_ms)
        if self._model is not None:
            self._model.reset_states()

    def open_speech(self) -> np.ndarray | None:
        """A copy of the open utterance's samples so far (16 kHz, pad included); None when none is open.

        Safe from another thread: the frame list is replaced, never emptied in place, and frames are never written.
        """
        frames = self._speech[:] if self._triggered else []
        return np.concatenate(frames) if frames else None

    @property
    def voicing(self) -> bool:
        """An utterance is open and its latest frame was speech (no silence nor quiet has started yet)."""
        return self._triggered and self._paused() == 0

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, AudioChunk)
        samples = audio.resample(message.samples, message.sample_rate, RATE)
        self._pending = np.concatenate([self._pending, samples])
        while len(self._pending) >= FRAME:
            frame, self._pending = self._pending[:FRAME], self._pending[FRAME:]
            yield from self._step(frame, self._model(frame))
            self._position += FRAME

    def _step(self, frame: np.ndarray, probability: float) -> Iterator[Message]:
        if not self._triggered:
            if probability < self.threshold:
                self._ring.append(frame)
                self._resume.add(frame)
                self._quiet.before(frame)
                return
            padding = list(self._ring) if self.pad_frames else []
            self._triggered, self._speech, self._silence = True, padding, 0
            self._segment_start = self._position - FRAME * len(padding)
            if resumed := self._resume.take():  # the speaker went on: the ended turn's audio opens this one
                self._speech, self._resumes, self._segment_start = resumed.frames, resumed.turn, resumed.start
                self._silence, self._shortened = FRAME * resumed.silent, resumed.shortened  # the gap: a pause
                self._carried = FRAME * max(0, len(self._speech) - len(padding))
            self._quiet.begin()
        self._speech.append(frame)
        quiet = self._quiet.hear(frame)
        if probability < self.threshold - 0.15:
            self._silence += FRAME
            self._early = self._early and self._silence < (self.speculative_silence or 0)
        else:
            if self._silence and self._gap is not None:
                self._shorten()
            self._silence = 0
            # the user went on: the early attempt is void, the utterance continues (an attempt begun on quiet
            # alone lasts through Silero's late speech frames while they stay quiet)
            if self._speculated and not (quiet and self._early):
                yield TurnDiscarded(self._turn)
                self._turn += 1
                self._speculated, self._judged, self._verdict, self._words_done = False, False, None, None
                self._hearing, self._early, self._sentence_end = None, False, None  # verdicts still coming are void
        length = FRAME * len(self._speech)
        voiced = length - self._silence - self._carried  # what was carried over was heard already
        if not self._started_sent and voiced >= self.min_speech:
            self._started_sent = True
            yield SpeechStarted(self._turn)
        if SpeechSoFar in self.wanted and not self._speculated and voiced >= self.min_speech:
            if pause_pass := self._pause_pass():
                yield pause_pass
            elif self._silence == 0 and len(self._speech) % PROGRESS_FRAMES == 0:
                yield self._so_far(self._speech)
        if (self._speculated and self._hearing is None and not self._judged and self.detector is not None
                and self._hear_silence is not None and self._silence >= self._hear_silence):
            self._hearing = Aside(self.detector, np.concatenate(self._speech), name="s2s-smart-turn")
        if self._silence >= (self._words_done or self._end_silence):
            if self._speculated:
                yield TurnConfirmed(self._turn, self._now())
                self._end_turn()
            else:
                yield from self._close(self._kept(), voiced=voiced)
        elif (self.speculative_silence and not self._speculated and voiced >= self.min_speech
              and self._paused() >= self.speculative_silence):
            self._speculated, self._early = True, self._silence < self.speculative_silence
            yield self._segment(self._kept(), speculative=True)
            if self._silence >= self._judge_silence:
                yield from self._judge()
        elif self._speculated and not self._judged and self._silence >= self._judge_silence:
            yield from self._judge()
        elif self.max_speech and length >= self.max_speech and not self._speculated:
            yield from self._close(self._speech, voiced=voiced, continues=True)

    def _shorten(self) -> None:
        """The speech goes on after a pause: keep ``gap_ms`` of Silero's silence in it."""
        run = len(self._speech) - 1 - self._silence // FRAME  # where the silence began
        self._speech, lost = shorten_pause(self._speech, self._silence // FRAME, *self._gap)
        self._shortened += lost
        if run < self._carried // FRAME:  # the gap after a resumed turn: carried frames went
            self._carried -= FRAME * lost

    def _judge(self) -> Iterator[Message]:
        """The open speculative turn's pause reached the judge silence: Smart Turn hears it now, and the words'
        verdict, if it came before, is applied now."""
        self._judged = True
        heard = None
        if self.detector is not None:
            heard, seconds = self._heard()
            yield Metric(self._turn, "smart_turn_s", seconds)  # the call's wall time, beside the turn's other work
        if self._fused:  # the words' verdict decides with it (``steer``); no Smart Turn: the words alone
            self._heard_done = heard is None or heard
        elif heard:
            yield TurnConfirmed(self._turn, self._now())  # the model heard a complete turn: end it now
            self._end_turn()
            return
        if self._verdict is not None:
            yield from self._decide(self._now())

    def _heard(self) -> tuple[bool, float]:
        """Smart Turn's verdict on the open pause, and how long its call took: heard in the background at the hear
        silence (ready by now as a rule; it is waited for if not), or now when nothing heard it (a detector set
        after the pause began)."""
        hearing, self._hearing = self._hearing, None
        start = time.perf_counter()
        done = bool(hearing.result()) if hearing is not None else self.detector(np.concatenate(self._speech))
        seconds = hearing.seconds if hearing is not None else time.perf_counter() - start
        sure = self._turn_settings.sure_threshold if self._fused else None  # turn=fused: its probability counts too
        heard = getattr(self.detector, "last_probability", None)  # Smart Turn keeps it; a stand-in may not
        self._heard_sure = done and sure is not None and heard is not None and heard >= sure
        return done, seconds

    def steer(self, message: Control) -> Iterator[Message]:
        """``turn=words``/``fused``: the LLM's verdict on the open speculative turn's words (:class:`TurnVerdict`)
        or the STT's on their sentence end (:class:`SentenceEnd`, which weighs it); a likely end ends the turn now,
        or at the judge silence if it came sooner.

        A verdict for a turn that is no longer open and silent (the user went on, or it ended) is ignored; an
        attempt begun on quiet is silent before Silero hears it so.
        """
        assert isinstance(message, (TurnVerdict, SentenceEnd))
        if not (self._speculated and self._triggered and message.turn == self._turn
                and (self._silence > 0 or self._early)):
            return
        if isinstance(message, SentenceEnd):
            self._sentence_end = message.probability
        else:
            self._verdict = message.complete_probability
        if self._judged and self._verdict is not None:
            yield from self._decide(self._position / RATE)

    def _decide(self, at: float) -> Iterator[Message]:
        settings = self._turn_settings
        probability = turn_detection.words_probability(self._verdict, self._sentence_end)
        bar = (settings.sure_words_threshold if self._heard_sure else settings.words_threshold) if self._fused \
            else settings.threshold
        done = probability >= bar
        self._words_done = None  # decided afresh: the STT's verdict after the words' may take back their wait
        if done and self._fused and not self._heard_done:  # the words say done, the audio does not
            if settings.words_done_ms is None:  # both must say done
                return
            self._words_done = _samples(settings.words_done_ms)
            done = self._silence >= self._words_done  # ... and that much silence may already have passed
        if done:
            yield TurnConfirmed(self._turn, at)
            self._end_turn()

    def _pause_pass(self) -> SpeechSoFar | None:
        """The STT's pass when a pause begins: the speech so far, silence (zeros) up to the speculative segment's
        length, so the STT starts 32 ms before the segment goes and the segment takes its words (the same in 49 of 56
        segments of real and espeak turns, tiny.en; casing and punctuation). Else at the pad, as the segment will be."""
        ahead = -(-(self.speculative_silence or 0) // FRAME) - 1  # frames from the pause's first to the segment
        if 0 < ahead < self.pad_frames:
            return self._so_far(self._speech + [SILENT] * ahead, True) if self._paused() == FRAME else None
        return self._so_far(self._kept(), True) if self._silence == max(1, self.pad_frames) * FRAME else None

    def _paused(self) -> int:
        """The open pause so far, for starting the work: Silero's silence, or the quiet if longer."""
        return max(self._silence, self._quiet.run)

    def _now(self) -> float:
        return (self._position + FRAME) / RATE

    def _kept(self) -> list[np.ndarray]:
        """The open utterance up to its last voiced frame, plus the trailing pad."""
        return self._speech[:len(self._speech) - self._silence // FRAME + self.pad_frames]

    def _segment(self, frames: list[np.ndarray], speculative: bool = False) -> SpeechSegment:
        samples = np.concatenate(frames)
        start = self._segment_start / RATE
        speech_end = (self._position + FRAME - self._paused()) / RATE
        end = start + (len(samples) + FRAME * self._shortened) / RATE  # on the input clock: the pauses' lost frames too
        return SpeechSegment(samples, RATE, self._turn, start, end,
                             speech_end_s=speech_end, closed_s=self._now(), speculative=speculative,
                             resumes=self._resumes)

    def _so_far(self, frames: list[np.ndarray], paused: bool = False) -> SpeechSoFar:
        return SpeechSoFar(tuple(frames), RATE, self._turn, self._segment_start / RATE, paused=paused)

    def _close(self, frames: list[np.ndarray], voiced: int, continues: bool = False) -> Iterator[Message]:
        """End the open segment; a split of continuing speech keeps the VAD triggered so nothing is lost."""
        ended = None
        if frames and (voiced >= self.min_speech or continues):
            yield self._segment(frames)
            ended, self._turn = self._turn, self._turn + 1
        self._end_turn(continues, ended)

    def _end_turn(self, continues: bool = False, ended: int | None = None) -> None:
        """Close the open utterance; the turn it was answered as (``ended``, or the open speculative one) is kept
        a while in case the speaker goes on."""
        if self._speculated:
            ended, self._turn = self._turn, self._turn + 1
        if ended is not None and not continues and self.barge_in:  # without barge-in the reply to it plays out
            self._resume.keep(Resumed(self._speech, ended, self._segment_start, self._silence // FRAME,
                                      self._shortened))
        self._resumes, self._carried, self._shortened = None, 0, 0
        self._speech, self._silence, self._started_sent, self._speculated = [], 0, False, False
        self._judged, self._verdict, self._words_done, self._hearing = False, None, None, None
        self._early, self._triggered, self._sentence_end = False, continues, None
        self._segment_start = self._position + FRAME
        self._ring.clear()

    def flush(self) -> Iterator[Message]:
        if self._speculated:
            yield TurnConfirmed(self._turn, self._now())
            self._end_turn()
        elif self._speech:
            yield from self._close(self._speech, voiced=FRAME * len(self._speech) - self._silence)

    def warm_up(self) -> None:
        if self.detector is not None:
            self.detector(np.zeros(RATE, dtype=np.float32))

    def describe(self) -> dict[str, Any]:
        return {"model": "silero_vad.onnx" if self.onnx else "silero_vad.jit (packaged)",
                **({"turn": "smart-turn-v3.2-cpu.onnx"}
                   if isinstance(self._turn_settings, turn_detection.HEARS) else {})}

"""The STT base: every backend writes only ``transcribe``; resampling and the turn's ending are the base's."""
from __future__ import annotations

import importlib
import logging

import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import CONF_DIR
from s2s.messages import Metric, SpeechSegment, Transcript, TurnEnd
from s2s.stt.base import STTStage, TranscriptionFailed


def stt_backends() -> list[type]:
    """The class behind every option of the stt group (``_*`` files are bases, not options)."""
    classes = []
    for path in sorted((CONF_DIR / "stt").glob("[!_]*.yaml")):
        if "_target_" not in (option := OmegaConf.load(path)):  # stt=none: no STT stage at all
            continue
        module, _, name = option._target_.rpartition(".")
        classes.append(getattr(importlib.import_module(module), name))
    return classes


@pytest.mark.parametrize("cls", stt_backends(), ids=lambda cls: cls.__name__)
def test_every_backend_writes_transcribe_and_nothing_of_the_turn(cls):
    assert issubclass(cls, STTStage)
    assert "transcribe" in vars(cls)
    assert not {"process", "accepts", "emits"} & set(vars(cls)), "the base owns process and the message types"
    assert cls.sample_rate == 16000


class Scripted(STTStage):
    """Answers from a script and keeps what it was given."""

    def __init__(self, *answers: tuple[str, str | None] | Exception) -> None:
        self.answers = list(answers)
        self.heard: list[np.ndarray] = []
        self.language, self.languages = "en", []  # the configured language; the one each call saw

    def transcribe(self, samples):
        self.heard.append(samples)
        self.languages.append(self.language)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def segment(rate: int, seconds: float, turn: int) -> SpeechSegment:
    return SpeechSegment(np.zeros(int(rate * seconds), np.float32), rate, turn, 0.0, seconds)


def test_the_base_resamples_and_yields_the_transcript_with_its_language():
    stage = Scripted(("Hello there.", "en"), ("Bonjour.", None))
    assert list(stage.process(segment(48000, 0.5, 3))) == [Transcript("Hello there.", 3, "en")]
    assert list(stage.process(segment(16000, 0.25, 4))) == [Transcript("Bonjour.", 4, None)]
    assert [len(samples) for samples in stage.heard] == [8000, 4000]  # 16 kHz whatever came in
    assert all(samples.dtype == np.float32 and samples.ndim == 1 for samples in stage.heard)


def test_no_words_and_a_failed_request_each_end_the_turn_with_one_log_line(caplog):
    stage = Scripted(("", "en"), TranscriptionFailed("stt=x at http://h failed: ReadTimeout"))
    with caplog.at_level(logging.INFO, logger="s2s.stt.base"):
        assert list(stage.process(segment(16000, 0.1, 7))) == [TurnEnd(7)]
        assert list(stage.process(segment(16000, 0.1, 8))) == [  # the error is an event of the turn's record
            Metric(8, "stt_error", 1.0, {"event": "stt_error", "error": "stt=x at http://h failed: ReadTimeout"}),
            TurnEnd(8)]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "turn 7: no words recognised, no reply"),
        (logging.ERROR, "turn 8: stt=x at http://h failed: ReadTimeout")]


@pytest.mark.parametrize("heard", [".", "...", " - ", "?!", "…"])
def test_marks_without_a_word_are_no_words_and_get_no_reply(heard):
    """Whisper hears a breath or a click as "." now and then; the LLM answered it ("I'm sorry for any
    misunderstanding ...")."""
    stage = Scripted((heard, "en"), ("2.", "en"), ("你好。", "zh"))
    assert list(stage.process(segment(16000, 0.1, 5))) == [TurnEnd(5)]
    assert list(stage.process(segment(16000, 0.1, 6))) == [Transcript("2.", 6, "en")]  # a number is a word
    assert list(stage.process(segment(16000, 0.1, 7))) == [Transcript("你好。", 7, "zh")]


def test_a_pause_pass_that_heard_marks_alone_leaves_the_segment_to_its_own_decode():
    """The pass at the pause hears zeros where the segment holds the pause's second frame: on gradio's one-second
    "Thank you." the packaged Whisper heard "." there, and the whole segment as "Thank you."."""
    from s2s.messages import SpeechSoFar

    stage = Scripted((".", "en"), ("Thank you.", "en"))
    stage.at_pause = True
    samples = np.zeros(16000, np.float32)
    assert list(stage.process(SpeechSoFar((samples,), 16000, 2, 0.5, paused=True))) == []
    assert list(stage.process(SpeechSegment(samples, 16000, 2, 0.5, 1.5))) == [Transcript("Thank you.", 2, "en")]
    assert len(stage.heard) == 2  # the pass, then the segment again


def test_a_segment_that_names_its_language_is_transcribed_in_it_and_the_stage_keeps_its_own():
    import dataclasses

    stage = Scripted(("Bonjour.", "fr"), ("Hello.", "en"), ("Hallo.", "de"))
    french = dataclasses.replace(segment(16000, 0.1, 1), language="fr")
    assert list(stage.process(french)) == [Transcript("Bonjour.", 1, "fr")]
    assert list(stage.process(segment(16000, 0.1, 2))) == [Transcript("Hello.", 2, "en")]
    assert stage.recognise(np.zeros(1600, np.float32), "de") == ("Hallo.", "de")  # a server's partial pass
    assert stage.languages == ["fr", "en", "de"] and stage.language == "en"


def test_other_errors_still_stop_the_run():
    with pytest.raises(RuntimeError, match="broken"):
        list(Scripted(RuntimeError("broken")).process(segment(16000, 0.1, 1)))


def test_warm_up_transcribes_a_second_of_silence():
    stage = Scripted(("", None))
    stage.warm_up()
    assert [len(samples) for samples in stage.heard] == [16000] and not stage.heard[0].any()

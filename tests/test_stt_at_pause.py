"""stt.at_pause: the packaged Whisper decodes the utterance when the speech pauses, so the turn's words are ready."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import compose_config
from s2s import audio
from s2s.bench.real_speech import recordings
from s2s.messages import SentenceEnd, SpeechSegment, SpeechSoFar, Transcript, TranscriptSoFar
from s2s.stt.faster_whisper import FasterWhisperSTT


class Decoding(FasterWhisperSTT):
    """The packaged STT with the default's pause pass, keeping the length and prefix of each decode."""

    def __init__(self) -> None:
        super().__init__(window_s=15, at_pause=True)
        self.decodes: list[tuple[int, str]] = []

    def transcribe_from(self, samples, prefix):
        self.decodes.append((len(samples), prefix))
        return super().transcribe_from(samples, prefix)

    def transcribe(self, samples):
        self.decodes.append((len(samples), ""))
        return super().transcribe(samples)


@pytest.fixture(scope="module")
def stt():
    stage = Decoding()
    stage.setup()
    yield stage
    stage.close()


@pytest.fixture(scope="module")
def real():
    """Three real people's sentences (2.8-4.0 s) from the turn bench's set."""
    return [clip.samples for clip in recordings()[7:12:2]]


def test_only_a_pause_is_decoded_and_the_segment_of_the_same_audio_costs_nothing_more(stt, real):
    for turn, samples in enumerate(real):
        stt.reset()
        stt.decodes.clear()
        half = samples[:len(samples) // 2]
        assert not list(stt.process(SpeechSoFar((half,), 16000, turn, float(turn))))  # speaking: no pass
        assert stt.decodes == []
        said = list(stt.process(SpeechSoFar((samples,), 16000, turn, float(turn), paused=True)))
        assert not any(isinstance(message, TranscriptSoFar) for message in said)  # partial words are not its job
        assert stt.decodes == [(len(samples), "")]  # one pass, the whole utterance, nothing forced on it
        [transcript] = list(stt.process(SpeechSegment(samples, 16000, turn, float(turn), 9.0, speculative=True)))
        assert isinstance(transcript, Transcript) and transcript.speculative
        assert len(stt.decodes) == 1  # the pause pass had heard exactly this audio
        assert transcript.text == stt.recognise(samples)[0]  # the words one pass at the end would give


def test_pauses_inside_one_utterance_never_force_words_on_the_decoder(stt, real):
    """Four pauses in one utterance: every pass and the segment decode the whole audio with no prefix (passes that
    agreed would commit words under incremental_s, and a forced prefix lost sentence endings there)."""
    stt.reset()
    stt.decodes.clear()
    speech = recordings()[5].samples  # 7.1 s of a LibriVox reader: the first three passes agree on 9 words
    for seconds in (4.0, 5.0, 6.0, 7.1):
        list(stt.process(SpeechSoFar((speech[:int(seconds * 16000)],), 16000, 0, 7.0, paused=True)))
    [transcript] = list(stt.process(SpeechSegment(speech, 16000, 0, 7.0, 9.0)))
    assert [prefix for _, prefix in stt.decodes] == [""] * 4 and stt._utterance.committed == []
    assert transcript.text == stt.recognise(speech)[0]


def test_a_segment_with_more_audio_than_the_pause_pass_is_decoded_whole(stt, real):
    stt.reset()
    stt.decodes.clear()
    first, second = real[0], real[1]
    list(stt.process(SpeechSoFar((first,), 16000, 0, 5.0, paused=True)))
    both = np.concatenate([first, audio.silence(0.3, 16000), second])  # the user went on after the pause
    [transcript] = list(stt.process(SpeechSegment(both, 16000, 1, 5.0, 9.0)))
    assert stt.decodes[-1] == (len(both), "") and len(transcript.text.split()) >= 6


def test_the_default_decodes_at_the_pause_and_asks_the_vad_for_it():
    cfg = compose_config([])
    assert cfg.stt.at_pause is True and cfg.stt.incremental_s is None
    assert SpeechSoFar in FasterWhisperSTT(at_pause=True).asks
    assert SpeechSoFar not in FasterWhisperSTT(at_pause=False).asks
    assert not FasterWhisperSTT(at_pause=True).decodes_while_speaking
    assert FasterWhisperSTT(incremental_s=0.5).decodes_while_speaking


def test_a_session_whose_stt_decodes_only_at_pauses_makes_its_own_partial_transcripts():
    """The session's own passes serve partial words (tests/test_server_partials.py) when the STT's passes come
    only at pauses; an incremental STT's passes serve them instead."""
    from s2s.server.stages import SessionVAD, TurnCounter
    from s2s.vad.silero import SileroVAD

    for stt, own in ((FasterWhisperSTT(at_pause=True), True), (FasterWhisperSTT(incremental_s=0.5), False)):
        session_vad = SessionVAD(SileroVAD(), TurnCounter())
        session_vad.enable_partials(stt, 0.5, lambda turn, text: None, lambda: True)
        assert (session_vad._partials is not None) is own


def test_a_speculative_turn_s_words_come_with_whisper_s_sentence_end_when_the_vad_takes_it(stt, real):
    """After the transcript, so the LLM starts on the words first; only for a speculative turn (the VAD is judging
    it) and only when the graph wants it (turn.sentence_end)."""
    samples = real[0]
    try:
        stt.wanted = frozenset({SentenceEnd})
        stt.reset()
        said = list(stt.process(SpeechSegment(samples, 16000, 3, 0.0, 9.0, speculative=True)))
        assert [type(message) for message in said] == [Transcript, SentenceEnd]
        # a probability ("Go forward 10 meters.": 0.46 on an AVX2 EPYC, over 0.5 elsewhere); how it tells finished
        # sentences from halves is test_real_speech's, over the whole real set
        assert said[1].turn == 3 and 0.0 < said[1].probability <= 1.0
        assert [type(m) for m in stt.process(SpeechSegment(samples, 16000, 4, 0.0, 9.0))] == [Transcript]
        stt.wanted = frozenset()
        assert [type(m) for m in stt.process(SpeechSegment(samples, 16000, 5, 0.0, 9.0, speculative=True))] \
            == [Transcript]
    finally:
        stt.wanted = frozenset()

"""Incremental recognition: LocalAgreement over passes, on the packaged Whisper tiny.en and in the real runner."""
from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from conftest import compose_config, trimmed
from graph_stages import Collector
from s2s import audio
from s2s.bench.recognition import as_spoken
from s2s.bench.roundtrip import word_error_rate
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.graph import Graph, NullObserver
from s2s.messages import (AudioChunk, Data, Message, ReplyText, SpeechSegment, SpeechSoFar, Transcript, TranscriptSoFar,
                          TurnDiscarded)
from s2s.stage import Source, Stage
from s2s.stt.base import STTStage
from s2s.stt.faster_whisper import FasterWhisperSTT
from s2s.stt.incremental import HELD_BACK, Utterance

SENTENCES = [("Please tell me a story about a dragon.", 150), ("How many minutes are in an hour?", 130),
             ("Turn on the kitchen lights and close the door.", 170),
             ("The quick brown fox jumps over the lazy dog and then runs all the way back home.", 150),
             ("I would like to book a table for four people at seven o'clock tonight, please.", 150),
             ("Can you remind me to call my mother when I get home from work tomorrow?", 160)]


# ---------------------------------------------------------------------------------------------- the agreement
def test_words_three_passes_hear_alike_are_committed_less_the_last_ones():
    utterance = Utterance(0.0, np.zeros(0, np.float32))
    assert utterance.update("What is", 8000) == []
    assert utterance.update("What is the cap", 16000) == []  # two passes are not enough
    assert utterance.update("What is the capital of", 24000) == ["What", "is"]  # "the" is held back
    assert utterance.prefix == "What is" and utterance.tentative == ["the", "capital", "of"]
    assert utterance.update(" the capital of France?", 32000) == ["the"]  # "cap" was not "capital"
    assert utterance.prefix == "What is the" and utterance.text() == "What is the capital of France?"
    assert utterance.text(" capital of France?") == "What is the capital of France?"
    assert HELD_BACK == 2 and utterance.heard == 32000


def test_a_word_written_another_way_is_not_agreed_and_punctuation_goes_on_the_last_word():
    utterance = Utterance(0.0, np.zeros(0, np.float32))
    for rest in ("how many minutes", "How many minutes are", "How many minutes are in"):
        utterance.update(rest, 16000)
    assert utterance.committed == []  # "how" is not "How": the decoder would be forced to write it so
    utterance.update("How many minutes are in an", 20000)
    assert utterance.committed == ["How", "many", "minutes", "are"]
    assert utterance.update(", in an hour?", 28000) == []  # it goes on the last committed word
    assert utterance.text() == "How many minutes are, in an hour?"
    assert utterance.shown() == "How many minutes are , in an"  # the guess at the last word is not shown


class Counting(STTStage):
    """Hears one more word of a fixed sentence in every pass; keeps the prefixes it was given."""

    incremental_s = 0.5

    def __init__(self) -> None:
        self.prefixes: list[str] = []

    def transcribe(self, samples):
        return "whole", "en"

    def transcribe_from(self, samples, prefix):
        self.prefixes.append(prefix)
        heard = "one two three four five six".split()[:len(samples) // 8000]
        return ("" if not prefix else " ") + " ".join(heard[len(prefix.split()):]), "en"  # " word", as Whisper


class Unsure(STTStage):
    """Never sure of a pass (faster-whisper would retry each one hotter); counts them."""

    incremental_s = 0.5

    def __init__(self) -> None:
        self.tries = 0

    def transcribe(self, samples):
        return "whole", "en"

    def transcribe_from(self, samples, prefix):
        self.tries += 1
        return None, "en"


def test_an_unsure_pass_waits_for_as_much_new_speech_as_a_sure_one():
    """A pass the backend was unsure of commits nothing, and the next comes after incremental_s of new speech, not
    at the VAD's next 128 ms of speech so far (which kept a core busy while the user spoke)."""
    stage, speech = Unsure(), np.linspace(-0.5, 0.5, 48000, dtype=np.float32)
    for end in range(2048, 48001, 2048):
        list(stage.process(SpeechSoFar((speech[:end],), 16000, 0, 2.0)))
    assert 4 <= stage.tries <= 6 and stage._utterance.committed == []  # 3 s of speech, a pass each 0.5 s
    [transcript] = list(stage.process(SpeechSegment(speech, 16000, 0, 2.0, 5.0)))
    assert transcript.text == "whole"  # the segment, unsure of as no pass heard it, is decoded whole


def test_another_utterance_at_the_same_start_is_not_taken_for_the_open_one():
    stage, speech = Counting(), np.linspace(-0.5, 0.5, 48000, dtype=np.float32)
    for end in range(8000, 48001, 8000):
        list(stage.process(SpeechSoFar((speech[:end],), 16000, 0, 2.0)))
    assert stage.prefixes[-1] == "one two three" and stage._utterance.committed == ["one", "two", "three", "four"]
    other = speech[::-1].copy()  # a VAD replaced mid-session starts its clock again: same start, other speech
    [transcript] = list(stage.process(SpeechSegment(other, 16000, 1, 2.0, 5.0)))
    assert stage.prefixes[-1] == "" and transcript.text == "one two three four five six"
    stage.reset()
    assert stage._utterance is None


# ---------------------------------------------------------------------------------------------- on tiny.en
class Listening(FasterWhisperSTT):
    """The packaged STT, keeping what each decode was asked (the prefix) and gave (the text after it)."""

    def __init__(self) -> None:
        super().__init__(window_s=15, incremental_s=0.5)
        self.decodes: list[tuple[int, str, str | None]] = []

    def transcribe_from(self, samples, prefix):
        rest, language = super().transcribe_from(samples, prefix)
        self.decodes.append((len(samples), prefix, rest))
        return rest, language


@pytest.fixture(scope="module")
def stt():
    stage = Listening()
    stage.setup()
    return stage


@pytest.fixture(scope="module")
def spoken(stt, espeak, tmp_path_factory):
    """Each sentence fed as the VAD feeds it, then its segment: (final, committed before it, whole-utterance
    decode, decodes the final made, the final's prefix, the utterance's samples)."""
    folder = tmp_path_factory.mktemp("incremental")
    found = []
    for index, (text, rate) in enumerate(SENTENCES):
        samples = trimmed(audio.read_audio(espeak(text, folder / f"{index}.wav", rate), 16000))
        stt.reset()
        so_far = as_spoken(samples, index)
        for message in so_far[:-1]:  # not the pause: the segment brings audio no pass has heard
            list(stt.process(message))
        committed, before = stt._utterance.prefix, len(stt.decodes)
        segment = so_far[-1].samples
        [final] = list(stt.process(SpeechSegment(segment, 16000, index, float(index), 9.0)))
        whole, _ = stt.transcribe(segment)
        found.append((final.text, committed, whole, stt.decodes[before:], segment))
    return found


def test_committed_words_begin_the_final_transcript(spoken):
    assert all(final.startswith(committed) for final, committed, *_ in spoken)
    # passes committed words. In which sentences depends on the CPU, since a word is committed only when three
    # passes over the partial audio write it alike ("how many?", then "how many minutes", then "Oh man, he made it."):
    # on an AVX2 EPYC one session measured 8 words in 2 of the first 4 sentences, the next 2 words in 1 of them;
    # the two longer sentences after them give the passes room: 25 words in 3 of the 6 there, 29 and 28 under
    # CT2_FORCE_CPU_ISA=AVX and GENERIC
    assert sum(len(committed.split()) for _, committed, *_ in spoken) >= 10, [s[:2] for s in spoken]


def test_the_final_decode_starts_after_the_committed_words(spoken):
    for final, committed, _, decodes, segment in spoken:
        [(length, prefix, rest)] = decodes  # one decode at the end, of the whole segment, after the prefix
        assert length == len(segment) and prefix == committed
        assert final == (committed + (rest if committed else " " + rest)).strip()


def test_the_final_transcript_is_as_good_as_one_pass_over_the_whole_utterance(spoken):
    errors = sum(word_error_rate(whole, final) * len(whole.split()) for final, _, whole, *_ in spoken)
    assert errors / sum(len(whole.split()) for _, _, whole, *_ in spoken) <= 0.15, [s[:3] for s in spoken]


def test_a_segment_the_pause_pass_heard_costs_no_decode_and_a_discard_keeps_the_committed_words(stt, spoken):
    # the sentence whose passes committed the most words (which one depends on the CPU), its passes made again
    index = max(range(len(spoken)), key=lambda at: len(spoken[at][1].split()))
    samples, key = spoken[index][-1], float(index)
    stt.reset()
    for message in as_spoken(samples[:-4 * 512], index)[:-1]:  # as_spoken pads the speech with 4 frames
        list(stt.process(message))
    committed = stt._utterance.committed[:]
    assert committed and stt._utterance.holds(key, samples)
    list(stt.process(SpeechSoFar((samples,), 16000, 0, key, paused=True)))  # the user pauses after it
    decodes = len(stt.decodes)
    [speculative] = list(stt.process(SpeechSegment(samples, 16000, 0, key, 9.0, speculative=True)))
    assert len(stt.decodes) == decodes and speculative.speculative  # the pause pass had heard exactly this
    committed = stt._utterance.committed[:]
    stt.discard(0)  # the user went on: the same utterance (same start) goes on as turn 1
    more = np.concatenate([samples, spoken[0][-1]])
    list(stt.process(SpeechSoFar((more,), 16000, 1, key)))
    assert stt._utterance.committed[:len(committed)] == committed and len(stt.decodes) == decodes + 1


def test_every_backend_but_faster_whisper_keeps_the_whole_utterance_pass():
    from s2s.stt.whisper import WhisperSTT

    assert SpeechSoFar not in WhisperSTT.__new__(WhisperSTT).asks
    assert SpeechSoFar in FasterWhisperSTT(incremental_s=0.5).asks
    assert SpeechSoFar not in FasterWhisperSTT(incremental_s=None).asks


# ---------------------------------------------------------------------------------------------- the runner
class Blocks(Source):
    """Progress messages, then a segment, as fast as the runner takes them."""

    def stream(self) -> Iterator[Message]:
        frames = tuple(np.zeros(512, np.float32) for _ in range(40))
        for count in range(4, 40, 4):
            yield SpeechSoFar(frames[:count], 16000, 0, 0.0)
        yield SpeechSegment(np.concatenate(frames), 16000, 0, 0.0, 1.28)


class Slow(Stage):
    """Takes 50 ms over each message and keeps what it was given."""

    accepts = (SpeechSegment, SpeechSoFar)

    def __init__(self) -> None:
        self.seen: list[Data] = []

    def process(self, message: Data) -> Iterator[Message]:
        self.seen.append(message)
        time.sleep(0.05)
        yield ReplyText(type(message).__name__, message.turn)  # type: ignore[attr-defined]


def test_the_runner_skips_speech_so_far_that_newer_messages_hold():
    stage = Slow()
    graph = Graph([("source", Blocks()), ("stt", stage), ("sink", Collector())])
    graph.setup()
    assert graph.run().status == "completed"
    kinds = [type(message) for message in stage.seen]
    assert kinds[-1] is SpeechSegment and len(kinds) < 5  # the backlog was skipped, the segment never


class Made(NullObserver):
    """Keeps what each stage emitted."""

    def __init__(self) -> None:
        self.by: dict[str, list[Message]] = {"vad": [], "stt": []}

    def on_output(self, stage: str, message: Message, now: float) -> None:
        self.by.setdefault(stage, []).append(message)


def test_a_turn_transcript_arrives_with_incremental_decoding_in_the_real_runner(tmp_path, espeak):
    """Real VAD, real packaged STT decoding while the speech plays (realtime), a speculative turn dropped when
    the user goes on: the whole turn's transcript arrives, after passes over the speech so far."""
    import soundfile

    from s2s.io.file import FileSource
    from s2s.vad.silero import SileroVAD

    first = trimmed(audio.read_audio(espeak("Please tell me a story", tmp_path / "a.wav"), 16000))
    second = trimmed(audio.read_audio(espeak("about a dragon.", tmp_path / "b.wav"), 16000))
    speech = np.concatenate([audio.silence(0.3, 16000), first, audio.silence(0.4, 16000), second,
                             audio.silence(0.8, 16000)])
    soundfile.write(tmp_path / "in.wav", speech, 16000)
    stt, sink, made = Listening(), Collector(), Made()
    graph = Graph([("source", FileSource(str(tmp_path / "in.wav"), realtime=True)), ("vad", SileroVAD()),
                   ("stt", stt), ("sink", sink)], made, wanted=(TranscriptSoFar,))
    graph.setup()
    assert graph.run().status == "completed"
    graph.close()
    assert TurnDiscarded(0) in made.by["vad"]  # the pause made a speculative turn, dropped when speech went on
    [(_, transcript)] = sink.received  # only the whole turn's transcript reached the end
    assert isinstance(transcript, Transcript) and transcript.turn == 1 and len(transcript.text.split()) >= 5
    assert any(isinstance(m, TranscriptSoFar) for m in made.by["stt"])  # the passes told what they heard
    assert len(stt.decodes) >= 3  # passes while the user spoke (how many committed words depends on the CPU)


# ---------------------------------------------------------------------------------------------- config
def test_incremental_s_is_validated_before_anything_loads(tmp_path):
    with pytest.raises(ConfigErrors, match=r"stt.incremental_s=0.1: invalid; expected a number from 0.2 to 5"):
        validate(compose_config(["stt.incremental_s=0.1"], tmp_path))
    assert validate(compose_config(["stt.incremental_s=0.5"], tmp_path))
    assert compose_config([], tmp_path).stt.incremental_s is None  # off until it measures faster (README)


# ---------------------------------------------------------------------------------------------- the server
def test_a_session_takes_its_partial_transcripts_from_an_incremental_stt(espeak, tmp_path):
    """No passes of the session's own: the VAD hands the speech so far on, and the STT's words come back."""
    from s2s.server.outbox import GraphObserver
    from s2s.server.stages import SessionVAD, TurnCounter
    from s2s.vad.silero import SileroVAD

    # work from 200 ms of silence: at the default 64 ms a gap between espeak's words starts (and drops) an attempt
    session_vad, sent = SessionVAD(SileroVAD(speculative_silence_ms=200), TurnCounter()), []
    session_vad.enable_partials(Counting(), 1.0, lambda turn, text: sent.append((turn, text)), lambda: True)
    assert session_vad._partials is None  # the STT's own passes serve the deltas
    session_vad.wanted = frozenset({SpeechSoFar})  # as the graph tells it when the STT asks
    session_vad.setup()
    speech = trimmed(audio.read_audio(espeak("Turn on the kitchen lights and close the door.", tmp_path / "s.wav"),
                                      16000))
    out = []
    for block in audio.chunks(np.concatenate([audio.silence(0.3, 16000), speech]), 512):
        out += list(session_vad.process(AudioChunk(block, 16000)))
    so_far = [m for m in out if isinstance(m, SpeechSoFar)]
    assert len(so_far) >= 5 and {m.turn for m in so_far} == {0}  # renumbered into the session's turns
    from s2s.metrics import Recorder

    observer = GraphObserver(Recorder(tmp_path), None, "vad", "sink", heard=session_vad.heard)  # type: ignore
    observer.on_output("stt", TranscriptSoFar(0, "Turn on the"), 0.0)  # the turn is still open: it goes out
    observer.on_output("stt", TranscriptSoFar(7, "other"), 0.0)  # not the open turn: dropped
    assert sent == [(0, "Turn on the")]

"""Partial transcripts: the rule for what a delta adds, the session VAD's passes, and a real server's deltas.

The server tests speak through the openai SDK on the shared llm=echo server (tests/conftest.py ``echo_server``,
the packaged tiny Whisper), paced as a microphone would be.
"""
from __future__ import annotations

import difflib
import threading
import time

import numpy as np
import pytest

from s2s.messages import AudioChunk, SpeechSegment, SpeechStarted
from s2s.server.outbox import UserHeard, UserPartial, UserStarted, UserStopped
from s2s.server.partials import new_suffix
from s2s.server.stages import SessionVAD, TurnCounter
from s2s.stt.base import STTStage
from s2s.stt.incremental import Utterance
from spies import Overlap
from test_server_items import run, translator

SENTENCE = "The quick brown fox jumps over the lazy dog and then runs all the way back home."  # no comma: no pause
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


def test_a_delta_is_what_the_new_text_adds_ignoring_case_and_spaces():
    assert new_suffix("", "Hello there") == "Hello there"
    assert new_suffix("Hello", "hello world") == " world"
    assert new_suffix("The quick", "The  quickest fox") == "est fox"
    assert new_suffix("Hello world", "hello   WORLD") == ""
    assert new_suffix("Hello world", "Hello, world. Again") == ". Again"  # punctuation moved: still a prefix
    assert new_suffix("Hello word", "Hello world, again") is None  # Whisper revised a word: nothing
    assert new_suffix("Hello world again", "Hello world") is None  # shorter: it revises too


def test_an_interim_pass_shows_neither_its_last_word_nor_its_closing_punctuation():
    def shown(text):
        utterance = Utterance(0.0, np.zeros(0, np.float32))
        utterance.update_whole(text, 16000)
        return utterance.shown()

    assert shown("The quick brown fo.") == "The quick brown"  # the last word may be cut: held back
    assert shown("The quick, brown.") == "The quick" and shown("The") == ""


def test_the_translator_sends_suffixes_and_the_rest_of_the_final_transcript():
    t = translator()
    events = run(t, UserStarted(0), UserPartial(0, "The quick"), UserPartial(0, "The quick brown"),
                 UserPartial(0, "The quack brown fox"),  # revised: nothing
                 UserPartial(0, "the quick brown fox"), UserStopped(0, 3.0), UserHeard(0, "The quick brown fox jumps."))
    deltas = [e for e in events if e["type"] == DELTA]
    assert [e["delta"] for e in deltas] == ["The quick", " brown", " fox", " jumps."]
    completed = [e for e in events if e["type"] == COMPLETED]
    assert completed[0]["transcript"] == "The quick brown fox jumps."
    assert {e["item_id"] for e in deltas} == {completed[0]["item_id"]}
    assert [e["type"] for e in events].index(COMPLETED) > [e["type"] for e in events].index(DELTA)

    revised = run(t, UserStarted(1), UserPartial(1, "Hello word"), UserHeard(1, "Hello world."))
    assert [e["delta"] for e in revised if e["type"] == DELTA] == ["Hello word"]  # the final revises: no rest
    assert [e["transcript"] for e in revised if e["type"] == COMPLETED] == ["Hello world."]

    quiet = translator(transcription=False)
    assert not [e for e in run(quiet, UserStarted(0), UserPartial(0, "Hello"), UserHeard(0, "Hello."))
                if "transcription" in e["type"]]


class VoicingVAD:
    """A VAD whose chunks script it: 1 speech (the utterance grows), 0 a pause (silence started), -1 its end."""

    accepts, emits, takes = (), (), ()

    def __init__(self):
        self.speech, self.voicing, self.turn = [], False, 0

    def process(self, message):
        value = message.samples[0] if len(message.samples) else None
        if value == 1:
            if not self.speech:
                yield SpeechStarted(self.turn)
            self.speech.append(np.ones(16000, np.float32))
            self.voicing = True
        elif value == 0:
            self.voicing = False
        elif value == -1:
            yield SpeechSegment(np.concatenate(self.speech), 16000, self.turn, 0.0, 1.0)
            self.speech, self.voicing, self.turn = [], False, self.turn + 1

    def open_speech(self):
        return np.concatenate(self.speech) if self.speech else None


class SlowSTT(STTStage):
    def __init__(self):
        self.calls, self.release = [], threading.Event()

    def transcribe(self, samples):
        self.calls.append(len(samples) / 16000)
        self.release.wait(10)
        return f"{len(samples) // 16000} seconds so.", "en"


def test_the_session_vad_runs_one_pass_at_a_time_only_while_the_user_voices():
    stt, sent = SlowSTT(), []
    vad = SessionVAD(VoicingVAD(), TurnCounter())
    from s2s.server.partials import PartialTranscriber

    vad.enable_partials(stt, 1.0, lambda turn, text: sent.append((turn, text)), lambda: True)
    assert isinstance(vad._partials, PartialTranscriber)
    chunk = lambda value: AudioChunk(np.array([value], np.float32), 16000)  # noqa: E731
    started = time.monotonic()
    assert [type(m) for m in vad.process(chunk(1))] == [SpeechStarted]  # 1 s: a pass starts, in its thread
    assert time.monotonic() - started < 1  # the VAD's thread never waits for it
    list(vad.process(chunk(1)))  # 2 s: one pass is running, none more
    deadline = time.monotonic() + 5
    while not stt.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stt.calls == [1.0]
    stt.release.set()
    vad._partials.close()
    assert sent == [(0, "1 seconds")]  # the closing period of an interim pass is dropped
    list(vad.process(chunk(0)))  # a pause: silence started, no pass
    list(vad.process(chunk(1)))  # 3 s, voicing again: a pass over all of it
    vad._partials.close()
    assert stt.calls == [1.0, 3.0] and sent[-1] == (0, "3 seconds")
    stt.release.clear()
    list(vad.process(chunk(1)))  # 4 s: a pass starts, then the segment goes out before it ends
    assert [type(m) for m in vad.process(chunk(-1))] == [SpeechSegment]
    stt.release.set()
    vad._partials.close()
    assert len(stt.calls) == 3 and len(sent) == 2  # the text came too late for its turn: dropped


def test_whole_utterance_passes_commit_what_three_agree_on_and_a_revision_takes_nothing_back():
    utterance = Utterance(0.0, np.zeros(0, np.float32))
    for text in ("Turn on", "Turn on the kitchen", "Turn on the kitchen lights and"):
        utterance.update_whole(text, 16000)
    assert utterance.committed == ["Turn", "on"]  # all three passes heard them
    utterance.update_whole("turn on the kitchen lights, and close", 20000)  # case and commas aside: it goes on
    assert utterance.committed == ["Turn", "on", "the", "kitchen"]
    assert utterance.shown() == "Turn on the kitchen lights, and"
    assert utterance.update_whole("Turn off the kitchen lights and close the door.", 24000) == []
    assert utterance.committed == ["Turn", "on", "the", "kitchen"]  # nothing taken back, nothing new shown
    assert utterance.shown() == "Turn on the kitchen"


def test_passes_come_less_often_as_the_utterance_grows_and_as_they_cost_more():
    utterance = Utterance(0.0, np.zeros(0, np.float32))
    seconds = lambda s: int(s * 16000)  # noqa: E731
    assert not utterance.due(seconds(0.4), 0.5, 16000) and utterance.due(seconds(0.5), 0.5, 16000)
    utterance.heard = seconds(9.0)  # past 8 s: twice the interval
    assert not utterance.due(seconds(9.9), 0.5, 16000) and utterance.due(seconds(10.0), 0.5, 16000)
    utterance.heard = seconds(40.0)  # past 30 s: six times, but never more than 2 s apart
    assert not utterance.due(seconds(41.9), 0.5, 16000) and utterance.due(seconds(42.0), 0.5, 16000)
    assert utterance.due(seconds(45.0), 5.0, 16000)  # a longer interval set is kept
    utterance.cost_s = 1.5  # a pass took 1.5 s: the next waits for 3 s of speech
    assert not utterance.due(seconds(42.9), 0.5, 16000) and utterance.due(seconds(43.0), 0.5, 16000)


class Unsure(STTStage):
    """A backend that can be made to start with given words but is never sure of such a pass (an utterance over
    30 s, for faster-whisper)."""

    def transcribe(self, samples):
        return "the whole of it.", "en"

    def transcribe_from(self, samples, prefix):
        return None, "en"


def test_a_partial_pass_the_backend_is_unsure_of_is_done_again_over_the_whole_utterance():
    stage, utterance, samples = Unsure(), Utterance(0.0, np.zeros(0, np.float32)), np.zeros(16000, np.float32)
    assert stage.forces_prefix
    assert not stage.advance(utterance, samples) and utterance.unsure == 16000  # the turn's own pass retries later
    assert stage.advance(utterance, samples, whole=True) and utterance.shown() == "the whole of"
    assert utterance.language == "en" and utterance.heard == 16000


# ---------------------------------------------------------------------------------------------- the packaged STT
class Counted:
    """Wraps the packaged STT's decodes to count how many run at once (the library is not thread-safe)."""

    def __init__(self, stage):
        self.overlap = Overlap()
        for name in ("transcribe", "transcribe_from"):
            setattr(stage, name, self.counting(getattr(stage, name)))

    def counting(self, decode):
        def counted(*args):
            with self.overlap.call():
                return decode(*args)
        return counted


@pytest.fixture(scope="module")
def progressive(espeak, tmp_path_factory):
    """The packaged tiny.en over four espeak sentences. Spoken as one utterance (short pauses between them), grown
    0.1 s at a time, with partial passes every 0.5 s of new speech: the texts delivered and the words committed
    after each. Then each sentence alone: its turn's own pass racing a partial pass on the same stage, and
    once more with nothing else running."""
    from conftest import trimmed
    from s2s import audio
    from s2s.server.partials import PartialTranscriber
    from s2s.stt.faster_whisper import FasterWhisperSTT
    from test_stt_incremental import SENTENCES

    stage = FasterWhisperSTT()
    stage.setup()
    counted = Counted(stage)
    folder = tmp_path_factory.mktemp("progressive")
    sentences = [trimmed(audio.read_audio(espeak(text, folder / f"{turn}.wav", rate), 16000))
                 for turn, (text, rate) in enumerate(SENTENCES)]
    delivered, committed, partials = [], [], None

    def deliver(turn, shown):
        if turn == 0:  # the long utterance's (not the racing passes' below)
            delivered.append(shown)
            committed.append(list(partials._utterance.committed))  # what the pass that delivered it committed

    partials = PartialTranscriber(stage, 0.5, deliver)
    speech = np.concatenate([part for sentence in sentences for part in (sentence, audio.silence(0.25, 16000))])
    for end in range(1600, len(speech), 1600):
        if partials.due(0, end):
            partials.start(0, speech[:end])
            partials.close()
    finals = []
    for turn, samples in enumerate(sentences, start=1):
        partials.start(turn, samples)  # a partial pass racing the turn's own: the stage runs one at a time
        [final] = list(stage.process(SpeechSegment(samples, 16000, turn, 0.0, 1.0)))
        partials.close()
        [alone] = list(stage.process(SpeechSegment(samples, 16000, turn, 0.0, 1.0)))
        finals.append((final.text, alone.text))
    assert counted.overlap.most == 1  # the partial passes never overlapped the turn's own pass
    return delivered, committed, finals


def test_partials_arrive_while_speaking_and_never_take_back_a_committed_word(progressive):
    delivered, committed, _ = progressive
    # passes every 0.5 s of speech, less often past 8 s, and at least twice what the last one took apart: fewer on
    # a slow or busy CPU (13 s of speech: 4 to 12 here)
    assert len(delivered) >= 3, delivered
    for index, words in enumerate(committed):
        stable = " ".join(words)
        assert all(new_suffix(stable, later) is not None for later in delivered[index:]), (stable, delivered)
        assert all(later[:len(words)] == words for later in committed[index:])
    assert len(committed[-1]) >= 2, delivered  # words settled while the user spoke


def test_the_final_transcript_is_the_same_with_partial_passes_as_without(progressive):
    *_, finals = progressive
    assert sum(final == alone for final, alone in finals) >= len(finals) - 1, finals


# ---------------------------------------------------------------------------------------------- a real server
@pytest.fixture(scope="module")
def long_speech(espeak, tmp_path_factory):
    from realtime_server import pcm16

    speech = pcm16(espeak(SENTENCE, tmp_path_factory.mktemp("partials") / "long.wav"), trailing_silence_s=2.0)
    assert 4.0 <= (len(speech) / 24000) - 2.0 <= 7.0  # a long sentence: several passes while it is spoken
    return speech


def speak(server, speech, paced):
    """One spoken turn: every event up to its transcript's ``.completed`` (all waits bounded)."""
    from realtime_server import API_KEY, Events, openai_client, send_speech

    server.wait_idle()
    with openai_client(server, API_KEY).realtime.connect(model="s2s-test") as connection:
        events = Events(connection)
        events.until("session.created", 30)
        send_speech(connection, speech, paced=paced)
        completed = events.until(COMPLETED, 120)
        events.until("response.done", 120)
    return events.all, completed


def check_deltas(events, completed):
    deltas = [e for e in events if e.type == DELTA]
    assert deltas and {e.item_id for e in deltas} == {completed.item_id}
    built = ""
    for delta in deltas:
        assert new_suffix(built, built + delta.delta) is not None
        built += delta.delta
    final = completed.transcript
    if new_suffix(built, final) is None:  # the final pass revised a word the deltas had: still close to it
        words = lambda text: "".join(c for c in text.lower() if c.isalnum() or c == " ").split()  # noqa: E731
        shown = words(built)
        assert difflib.SequenceMatcher(None, shown, words(final)[:len(shown)]).ratio() >= 0.5, (built, final)
    return deltas


def test_partial_transcripts_arrive_while_the_user_still_speaks(echo_server, long_speech):
    events, completed = speak(echo_server, long_speech, paced=True)
    assert "fox" in completed.transcript.lower()
    kinds = [e.type for e in events]
    deltas = check_deltas(events, completed)
    assert kinds.index(DELTA) < kinds.index("input_audio_buffer.speech_stopped"), kinds
    assert len(deltas) >= 2 and kinds.index(COMPLETED) > max(i for i, k in enumerate(kinds) if k == DELTA)


def test_with_partial_transcripts_null_only_the_final_delta_is_sent(tmp_path, long_speech):
    from realtime_server import API_KEY, RunningServer

    server = RunningServer(tmp_path / "run", "llm=echo", "server.max_sessions=1", "server.partial_transcripts_s=null",
                           env={"S2S_API_KEY": API_KEY})
    try:
        events, completed = speak(server, long_speech, paced=False)
    finally:
        assert server.stop() == 0, server.output[-3000:]
    deltas = [e for e in events if e.type == DELTA]
    assert [e.delta for e in deltas] == [completed.transcript]


def test_the_rest_of_an_utterance_after_a_void_attempt_is_the_same_item(espeak, tmp_path):
    """A short pause starts a speculative attempt; the user goes on, so it is void and the rest of the utterance
    takes a new turn number (the void attempt's late work is told apart by it). The client still sees one
    utterance: one ``speech_started``, one item, one run of deltas that the final transcript completes."""
    from conftest import trimmed
    from s2s import audio
    from s2s.messages import SpeechSoFar, TurnConfirmed, TurnDiscarded
    from s2s.vad.silero import SileroVAD

    halves = [trimmed(audio.read_audio(espeak(text, tmp_path / f"{n}.wav"), 16000))
              for n, text in enumerate(["The quick brown fox", "jumps over the lazy dog."])]
    pause = audio.silence(0.13, 16000)  # past the 64 ms that start the work, short of the 600 ms that end a turn
    samples = np.concatenate([audio.silence(0.5, 16000), halves[0], pause, halves[1], audio.silence(1.5, 16000)])
    turns = TurnCounter()
    vad = SessionVAD(SileroVAD(speculative_silence_ms=64), turns)
    vad.wanted = frozenset({SpeechSoFar})
    vad.setup()
    out = [m for block in audio.chunks(samples, 512) for m in vad.process(AudioChunk(block, 16000))]
    started = [m for m in out if isinstance(m, SpeechStarted)]
    void = [m.turn for m in out if isinstance(m, TurnDiscarded)]
    [stood] = [m.turn for m in out if isinstance(m, TurnConfirmed)]
    [final] = [m for m in out if isinstance(m, SpeechSegment) and m.turn == stood]
    assert len(started) == 1 and void and stood not in void  # the attempt was void, the rest stood
    assert {turns.utterance(m.turn) for m in out if getattr(m, "turn", None) is not None} == {started[0].turn}
    assert final.end_s - final.start_s > 2.0  # the whole utterance, both halves

    t = translator()
    t.utterance = turns.utterance
    first, rest = started[0].turn, final.turn
    events = run(t, UserStarted(first), UserPartial(first, "The quick brown"), UserPartial(rest, "The quick brown fox"),
                 UserStopped(rest, final.end_s), UserHeard(rest, "The quick brown fox jumps over the lazy dog."))
    user = [e for e in events if e["type"].startswith(("input_audio_buffer.", "conversation.item."))
            and e.get("item", {}).get("role", "user") == "user"]
    ids = {e["item_id"] for e in user if "item_id" in e} | {e["item"]["id"] for e in user if "item" in e}
    assert len(ids) == 1 and len(user) >= 6, user  # started, committed, added, 2 deltas, completed, done
    deltas = "".join(e["delta"] for e in events if e["type"] == DELTA)
    assert deltas == "The quick brown fox jumps over the lazy dog."

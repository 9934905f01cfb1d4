"""The order of model calls when a server has more pipelines than cores (s2s.turn_order): the turn that ended first
goes first, the rest of a reply after other turns' first audio, partial transcripts last."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
from graph_stages import Collector, CountingSource, Segmenter
from spies import Overlap

from s2s import turn_order
from s2s.graph import Graph
from s2s.messages import Data, ReplyAudio, ReplyText, SpeechSegment, SpeechSoFar, Transcript, TurnEnd
from s2s.platform import model_slots
from s2s.stage import Stage


def test_a_free_slot_goes_to_the_first_turn_then_the_rest_of_replies_then_partials():
    line = turn_order.Order(1)
    served: list[str] = []
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with line.slot((turn_order.FIRST, 0.0)):
            holding.set()
            release.wait(10)

    def wait(name: str, rank: turn_order.Rank) -> None:
        with line.slot(rank):
            served.append(name)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    ranks = {"partial": (turn_order.AHEAD, 1.0), "rest of a reply": (turn_order.REST, 1.0),
             "later turn": (turn_order.FIRST, 3.0), "earlier turn": (turn_order.FIRST, 2.0)}
    waiters = [threading.Thread(target=wait, args=item) for item in ranks.items()]
    for waiter in waiters:  # queued in the wrong order on purpose
        waiter.start()
        time.sleep(0.02)
    release.set()
    for thread in [holder, *waiters]:
        thread.join(10)
    assert served == ["earlier turn", "later turn", "rest of a reply", "partial"]


def test_no_more_calls_run_at_once_than_there_are_slots():
    line, overlap = turn_order.Order(2), Overlap()

    def call(index: int) -> None:
        with line.slot((turn_order.FIRST, float(index))), overlap.call():
            time.sleep(0.03)

    threads = [threading.Thread(target=call, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert overlap.most == 2 and overlap.running == 0


def test_a_turn_keeps_its_place_until_its_first_audio_and_partials_come_last():
    ranks = turn_order.Ranks()
    segment = SpeechSegment(np.zeros(160, np.float32), 16000, 3, 0.0, 0.01)
    first = ranks.of(segment)
    time.sleep(0.01)
    assert ranks.of(Transcript("hi", 3, "en")) == first and first[0] == turn_order.FIRST  # let go once, ranked once
    ranks.spoke(3)
    assert ranks.of(ReplyText("hi.", 3)) == (turn_order.REST, first[1])
    assert ranks.of(SpeechSoFar((np.zeros(160, np.float32),), 16000, 4, 0.0))[0] == turn_order.AHEAD
    for turn in range(4, 30):  # bounded: old turns are forgotten
        ranks.of(Transcript("hi", turn, "en"))
    assert len(ranks._since) <= 10


def test_the_order_is_off_unless_a_server_has_more_pipelines_than_cores_can_run():
    cores = len(os.sched_getaffinity(0))
    assert turn_order.slots() is None  # a local run: every call at once, as before
    assert model_slots(1, None) is None and model_slots(cores, 1) is None  # each pipeline has a core
    assert model_slots(cores + 1, 1) == cores and model_slots(64, 1) == min(cores, 64)
    assert model_slots(64, cores) == 1


class Busy(Stage):
    """A model stage stand-in that keeps its slot busy: ``pieces`` outputs of ``kind`` per input, each taking
    ``each_s``; it records when it made each, and ``overlap`` counts the stages running at once."""

    overlap = Overlap()

    def __init__(self, accepts: type[Data], makes: type[Data], pieces: int = 1, each_s: float = 0.05) -> None:
        self.accepts, self.emits, self.pieces, self.each_s = (accepts,), (makes,), pieces, each_s
        self.made: list[tuple[float, int, int]] = []

    def process(self, message: Data):
        turn = message.turn
        for index in range(self.pieces):
            with Busy.overlap.call():
                time.sleep(self.each_s)
            self.made.append((time.perf_counter(), turn, index))
            if self.emits[0] is Transcript:
                yield Transcript(f"turn {turn}", turn, "en")
            elif self.emits[0] is ReplyText:
                yield ReplyText(f"sentence {index}.", turn)
            else:
                yield ReplyAudio(np.full(2400, 0.1, np.float32), 24000, turn)
        if self.emits[0] is ReplyText:
            yield TurnEnd(turn)


def pipeline(sentences: int, delay_s: float) -> tuple[Graph, Busy]:
    voice = Busy(ReplyText, ReplyAudio, each_s=0.05)
    stages = [("source", CountingSource(turns=1, delay_s=delay_s)), ("vad", Segmenter()),
              ("stt", Busy(SpeechSegment, Transcript, each_s=0.05)),
              ("llm", Busy(Transcript, ReplyText, pieces=sentences, each_s=0.05)), ("tts", voice),
              ("sink", Collector())]
    return Graph(stages), voice


def test_pipelines_model_calls_take_turns_and_a_reply_that_has_spoken_waits_behind_first_audio():
    """Three pipelines on one slot: their STT, LLM and TTS calls never run at once, every reply still comes
    whole, and a turn whose first audio was made ranks its rest behind other turns' first audio."""
    turn_order.configure(1)
    try:
        Busy.overlap = Overlap()
        pipelines = [pipeline(sentences=3, delay_s=0.05 * index) for index in range(3)]
        threads = [threading.Thread(target=graph.run) for graph, _ in pipelines]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        turn_order.configure(None)
    assert not any(thread.is_alive() for thread in threads)
    assert Busy.overlap.most == 1 and all(len(voice.made) == 3 for _, voice in pipelines)
    graph = pipelines[0][0]
    assert graph._ranks.of(ReplyText("more.", 0))[0] == turn_order.REST


def test_a_stage_that_waits_on_the_network_takes_no_slot():
    """A remote API's call waits on the network, not the cores: ordering it would hold other sessions back."""
    from s2s.llm.openai_lm import OpenAILM
    from s2s.stt.openai_stt import OpenAISTT
    from s2s.tts.openai_tts import OpenAITTS

    assert not any(kind.on_cores for kind in (OpenAILM, OpenAISTT, OpenAITTS))

    class Remote(Busy):
        on_cores = False

    stages = [("source", CountingSource(turns=1)), ("vad", Segmenter()),
              ("stt", Busy(SpeechSegment, Transcript)), ("llm", Remote(Transcript, ReplyText)),
              ("tts", Busy(ReplyText, ReplyAudio)), ("sink", Collector())]
    assert Graph(stages)._ordered == {2, 4}

"""The espeak-ng program that Piper and KittenTTS read their phonemes from: one process stays running per stage
and answers each reply chunk as one process per chunk would, and a process that fails or stalls is replaced."""
from __future__ import annotations

import subprocess
import time

from onnx_tts import needs_espeak
from s2s.tts import espeak
from s2s.tts.piper import PiperTTS
from s2s.text import has_words
from s2s.tts.espeak import MARK, Espeak, _blocks, split_clauses
from spies import spy
from tests.conftest import CACHE
from tests.fixtures import piper as tiny

TEXTS = ["Well, Mr. and Mrs. Smith paid $5.50 for 3 apples; how odd! Dr. Jones said: it's fine. Yes? No.",
         "The capital of France is", "Café, naïve résumé: 100% sure... really?!",
         "How many days are there in a leap year?", "Hello there, my friend. How are you today?"]


def lines(text: str) -> list[str]:
    return [clause for clause, _, _ in split_clauses(text) if has_words(clause)]  # as Espeak.sentences asks


def own_process(reader: Espeak, text: str) -> list[list[str]]:
    """What one espeak-ng run for ``text``'s lines alone answers (the way before the running process)."""
    return _blocks(subprocess.run(reader.command, input="".join(f"{line}\n\n" for line in lines(text)),
                                  capture_output=True, encoding="utf-8", check=True).stdout)


@needs_espeak
def test_one_running_espeak_answers_every_chunk_as_a_process_of_its_own_would(monkeypatch):
    reader = Espeak("en-us", backend="tts=piper")
    started, once = spy(monkeypatch, subprocess, "Popen"), spy(monkeypatch, subprocess, "run")
    heard = [reader.ipa(lines(text)) for text in TEXTS * 2]
    assert len(started) == 1 and not once  # one process for all twelve chunks
    monkeypatch.undo()
    assert heard == [own_process(reader, text) for text in TEXTS * 2]
    reader.close()


@needs_espeak
def test_an_espeak_that_died_is_started_again_and_loses_no_chunk(monkeypatch):
    reader = Espeak("en-us", backend="tts=piper")
    expected = [own_process(reader, text) for text in TEXTS[:2]]
    assert reader.ipa(lines(TEXTS[0])) == expected[0]
    assert reader._running is not None
    reader._running._process.kill()
    reader._running._process.wait()
    started = spy(monkeypatch, subprocess, "Popen")  # subprocess.run starts its process through it too
    assert [reader.ipa(lines(text)) for text in TEXTS[:2]] == expected
    assert len(started) == 2  # the chunk the dead one failed ran alone, the next one started a running one
    reader.close()


@needs_espeak
def test_a_chunk_that_holds_the_end_mark_goes_to_a_process_of_its_own(monkeypatch):
    reader = Espeak("en-us", backend="tts=piper")
    text = f"Say {MARK.upper()} twice: {MARK}, {MARK}."
    expected = [own_process(reader, text), own_process(reader, TEXTS[1])]
    once = spy(monkeypatch, subprocess, "run")
    assert [reader.ipa(lines(text)), reader.ipa(lines(TEXTS[1]))] == expected
    assert len(once) == 1  # the text with the mark alone
    reader.close()


@needs_espeak
def test_a_stalled_espeak_is_stopped_and_the_chunk_answered_by_a_run_of_its_own(monkeypatch):
    """A program that reads and never answers stands in for a hung espeak-ng: the chunk waits ANSWER_S, no more."""
    monkeypatch.setattr(espeak, "ANSWER_S", 0.3)
    reader = Espeak("en-us", backend="tts=piper")
    reader.command = ["sh", "-c", "cat > /dev/null"]
    started = time.monotonic()
    assert reader.ipa(["Hello there"]) == []  # the run of its own answered nothing either
    assert time.monotonic() - started < 3.0 and reader._running is None


@needs_espeak
def test_close_ends_the_running_espeak_and_the_next_chunk_starts_another():
    reader = Espeak("en-us", backend="tts=piper")
    reader.ipa(lines(TEXTS[1]))
    process = reader._running._process
    reader.close()
    assert process.poll() is not None and reader._running is None
    assert reader.ipa(lines(TEXTS[1])) == own_process(reader, TEXTS[1])
    assert reader._running is not None and reader._running._process.poll() is None
    reader.close()


@needs_espeak
def test_the_stage_s_close_stops_its_espeak():
    stage = PiperTTS(model=str(tiny.cached(CACHE / "models") / tiny.SINGLE))
    stage.setup()
    list(stage.synthesize("Hello there.", None))
    process = stage._espeak._running._process
    stage.close()
    assert process.poll() is not None

"""Incremental recognition: the words of an utterance that consecutive passes agree on are committed.

While the user speaks, the STT decodes the utterance so far again every so often ("LocalAgreement", Machacek,
Dabre and Bojar 2023, as in whisper_streaming). The words after the committed ones that the last ``AGREEING``
passes all heard alike are committed: they no longer change, and every later pass (and the final one) is forced to start
with them, so its decoder makes only what follows them. At the end of speech only those last words are new.

The encoder still hears the whole utterance: cutting the audio at the last committed word's time (the paper's
way) lost or garbled a word at the cut in about one espeak sentence in three with Whisper tiny.en, whose word
times (cross-attention) are off by a tenth of a second or more on short windows, and the encoder's window is
what a short utterance's pass costs anyway (``python -m s2s.bench recognition`` compares).

The same :class:`Utterance` serves both users of passes over an open utterance: the STT's own incremental
decoding (``stt.incremental_s``, whose committed words begin the final transcript) and the realtime server's
partial transcripts (``server.partial_transcripts_s``), which show the committed words and never take one back.
A backend that cannot be made to start with the committed words decodes the whole utterance each pass
(:meth:`Utterance.update_whole`). The passes come progressively, as the reference system's live transcription does
(:meth:`Utterance.due`): after every so much new speech, less often as the utterance grows, and (partial
transcripts) never so often that passes would hold the stage most of the time.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

# consecutive passes that must hear a word alike for it to be committed: with two, tiny.en's guess at a word it
# heard only the start of ("roundfire jump" for "brown fox jumps") was agreed on and kept
AGREEING = 3
HEAD = 1600  # samples an utterance is recognised by, with its start (0.1 s)
HELD_BACK = 2  # a pass's last words are never committed: where the audio stops Whisper guesses words and commas
OPEN_END = " .,;:!?\u2026"  # a pass ends where the audio does: closing punctuation there is a guess
# the interval between passes grows with the utterance (its seconds below each bound: that factor), as the
# reference's live transcription does, since each pass decodes all of it; up to LONGEST_S unless set longer
GROWTH = ((8.0, 1.0), (15.0, 2.0), (30.0, 4.0), (float("inf"), 6.0))
LONGEST_S = 2.0
COST = 2.0  # a partial pass waits at least this many times what the last one took: the stage is free half the time


def agreed(before: Sequence[str], now: Sequence[str]) -> int:
    """How many words at the start of ``now`` the previous pass heard too (their longest common prefix).

    Case and punctuation count: the decoder is made to start with the committed words, and a word Whisper wrote
    in a form it would not write for the whole utterance ("how" for "How", "minutes," where the audio stopped)
    leads it astray ("how many minutes, sorry, an hour" for "How many minutes are in an hour?").
    """
    count = 0
    for old, new in zip(before, now):
        if old != new:
            break
        count += 1
    return count


def _plain(word: str) -> str:
    return "".join(char for char in word.lower() if char.isalnum())


class Utterance:
    """LocalAgreement over one utterance: its committed words and the last pass's words after them.

    Args:
        key: the utterance's start on the input clock (``start_s``): it names the utterance across a discarded
            speculative turn, whose speech goes on as a new turn from the same start.
        samples: the utterance so far, whose first ``HEAD`` samples are kept to recognise it.
    """

    def __init__(self, key: float, samples: np.ndarray) -> None:
        self.key, self.head = key, samples[:HEAD].copy()
        self.committed: list[str] = []
        self.tentative: list[str] = []  # the last pass's words after the committed ones
        self.heard = -1  # samples the last pass heard: a segment of exactly these has its words already
        self.said = ""  # the last pass's transcript
        self.unsure = -1  # samples of the last pass the backend was not sure of (it would retry it)
        self.recent: deque[list[str]] = deque(maxlen=AGREEING - 1)  # the last passes' words, committed ones included
        self.passes = 0
        self.cost_s = 0.0  # what the last pass took
        self.language: str | None = None  # the language the last pass heard

    def due(self, length: int, every_s: float, rate: int, cost: float = COST) -> bool:
        """Whether a pass over the first ``length`` samples is due: ``every_s`` of speech since the last pass
        heard, times the utterance's ``GROWTH`` (at most ``LONGEST_S``, or ``every_s`` if longer), and at least
        ``cost`` times what the last pass took. The STT's own passes take ``cost=0``: each makes its turn's final
        pass cheaper, while partial transcripts only show words and must leave the stage to the turns."""
        factor = next(factor for bound, factor in GROWTH if length / rate < bound)
        interval = max(min(every_s * factor, max(every_s, LONGEST_S)), cost * self.cost_s)
        return length - max(self.heard, self.unsure, 0) >= interval * rate  # an unsure pass waits as a sure one

    def holds(self, key: float, samples: np.ndarray) -> bool:
        """``samples`` (from the utterance's start) are this utterance: the same start and the same first samples
        (a VAD replaced mid-session restarts its clock, so a start alone may come again)."""
        return key == self.key and np.array_equal(samples[:len(self.head)], self.head)

    @property
    def prefix(self) -> str:
        """The committed text: every later pass starts with it."""
        return " ".join(self.committed)

    def update(self, rest: str, heard: int) -> list[str]:
        """Take a pass's words after the committed ones (``rest``, with its leading space unless it goes on the
        last committed word, as a comma does) over the first ``heard`` samples; commit what it and the passes
        before it agree on, less its last ``HELD_BACK`` words. Returns the words it committed."""
        self.said = self.text(rest)
        words = rest.split()
        attached = bool(self.committed and rest[:1].strip())  # its first piece ends the last committed word
        heard_all = [*self.committed, *words]
        count = min([agreed(before[len(self.committed):], words) for before in self.recent] or [0])
        count = 0 if attached or len(self.recent) < AGREEING - 1 else min(count, max(0, len(words) - HELD_BACK))
        self.recent.append(heard_all)
        new, self.tentative = words[:count], words[count:]
        self.committed += new
        self.heard, self.passes = heard, self.passes + 1
        return new

    def update_whole(self, text: str, heard: int) -> list[str]:
        """Take a pass that decoded the whole utterance (a backend that cannot be made to start with the committed
        words): its words after them, when it begins with them (case and punctuation aside: nothing is forced on
        the decoder here). One that revises a committed word commits nothing and shows nothing new: the committed
        words stand."""
        words = text.split()
        if agreed([_plain(word) for word in self.committed], [_plain(word) for word in words]) < len(self.committed):
            self.tentative, self.heard, self.passes = [], heard, self.passes + 1
            return []
        rest = " ".join(words[len(self.committed):])
        return self.update(" " + rest if self.committed else rest, heard)

    def text(self, rest: str | None = None) -> str:
        """The transcript: the committed words and ``rest`` (None: the last pass's transcript)."""
        if rest is None:
            return self.said
        return (self.prefix + (rest if self.committed else " " + rest)).strip()

    def shown(self) -> str:
        """What may be shown while the user speaks: the committed words and the last pass's guesses, less its last
        word (the audio may cut it in the middle) and the closing punctuation a pass puts where the audio stops."""
        return " ".join([*self.committed, *self.tentative[:-1]]).rstrip(OPEN_END)

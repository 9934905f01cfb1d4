"""Calibrated replies: a reply the model is unsure of says so, decided on its first few tokens.

CTranslate2 gives each generated token's log-probability. :class:`Calibrator` holds the reply's first sentence
(or up to ``WINDOW_TOKENS`` content tokens), measures the model's confidence over its content tokens (the mean
or the lowest token probability) and then releases it unchanged, prefixed with
``UNSURE_PREFIX`` (below ``unsure_below``) or replaced by ``DONT_KNOW`` (below ``dont_know_below``, which ends the
reply). Only the first chunk waits for the decision; with both thresholds off nothing is held and the confidence
is still reported, so ``python -m s2s.bench answers --sweep-unsure`` can score every threshold from one run.
"""
from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

UNSURE_PREFIX = "I'm not sure, but I think"
DONT_KNOW = "I don't know that one."
WINDOW_TOKENS = 8  # content tokens measured at most: about a short answer's first clause ("The capital is Paris")
Measure = Literal["mean", "min"]
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s*$")
_KEEP_CASE = re.compile(r"^(I\b|I'|[A-Z]{2,}|[A-Z][a-z]*[A-Z])")  # "I", "I'm", "NASA", "McDonald's"


def _alnum(text: str) -> str:
    return re.sub(r"[\W_]+", " ", text.lower()).strip()


@dataclass(frozen=True)
class Confidence:
    """The model's confidence in a reply's first tokens, yielded by a stream once measured (a metric)."""

    mean: float  # mean token probability over the window
    min: float  # lowest token probability in it
    tokens: int  # content tokens measured
    seconds: float  # from the stream's start to the decision
    verdict: Literal["sure", "unsure", "dont_know"]


@dataclass(frozen=True)
class Capped:
    """Yielded by a stream that stopped at ``max_new_tokens``: its last word may be cut, so it is trimmed."""


def hedged(text: str) -> str:
    """``text`` after the unsure prefix: "Paris is ..." -> "I'm not sure, but I think paris is ..." keeps "I"."""
    text = text.lstrip()
    if text and not _KEEP_CASE.match(text):
        text = text[0].lower() + text[1:]
    return f"{UNSURE_PREFIX} {text}"


class Calibrator:
    """Decides on a reply's first tokens whether it is spoken as is, hedged or replaced by "I don't know".

    Args:
        unsure_below: a confidence below this hedges the reply (a probability, 0-1); None: never.
        dont_know_below: a confidence below this replaces the reply with ``DONT_KNOW``; None: never.
        measure: ``mean`` or ``min`` token probability over the window.
        question: the user's words: a token they contain ("The capital of France" echoed back, "a", "of") is
            not content, so the confidence is the model's in what it adds (the fact), not in the echo.
        window: content tokens measured at most (fewer when the first sentence ends sooner).
    """

    def __init__(self, unsure_below: float | None, dont_know_below: float | None, measure: Measure = "mean",
                 question: str = "", window: int = WINDOW_TOKENS) -> None:
        self.unsure_below, self.dont_know_below = unsure_below, dont_know_below
        self.measure, self.window = measure, window
        self.question = _alnum(question).split()
        self.holds = unsure_below is not None or dont_know_below is not None
        self.stop = False  # the reply was replaced: generation can end
        self._start = time.perf_counter()
        self._held = ""
        self._probabilities: list[float] = []
        self._echoes: list[float] = []
        self._decided = False

    def feed(self, text: str, log_prob: float | None) -> Iterator[str | Confidence]:
        """One decoded token; yields the text to speak (held until the decision) and, once, the ``Confidence``."""
        if self._decided:
            if not self.stop:
                yield text
            return
        self._held += text
        if log_prob is not None and (word := _alnum(text)):
            if not any(word in known for known in self.question):
                self._probabilities.append(math.exp(log_prob))
            else:  # kept in case the reply has nothing but echoes
                self._echoes.append(math.exp(log_prob))
        if not self.holds:
            yield text
        if len(self._probabilities) >= self.window or len(self._echoes) >= 3 * self.window or \
                (self._probabilities and _SENTENCE_END.search(self._held)):
            yield from self._decide()

    def finish(self) -> Iterator[str | Confidence]:
        """The reply ended before the window filled: decide on what there is."""
        if not self._decided and (self._probabilities or self._echoes):
            yield from self._decide()
        elif not self._decided and self.holds and self._held:
            self._decided = True
            yield self._held

    def _decide(self) -> Iterator[str | Confidence]:
        self._decided = True
        measured = self._probabilities or self._echoes  # a reply of nothing but echoes: measured on them
        mean = sum(measured) / len(measured)
        value = mean if self.measure == "mean" else min(measured)
        verdict: Literal["sure", "unsure", "dont_know"] = "sure"
        if self.dont_know_below is not None and value < self.dont_know_below:
            verdict = "dont_know"
        elif self.unsure_below is not None and value < self.unsure_below:
            verdict = "unsure"
        yield Confidence(mean, min(measured), len(measured),
                         time.perf_counter() - self._start, verdict)
        if not self.holds:
            return
        if verdict == "dont_know":
            self.stop = True
            yield DONT_KNOW
        else:
            yield hedged(self._held) if verdict == "unsure" else self._held

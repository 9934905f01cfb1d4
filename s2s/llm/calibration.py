"""Calibrated replies: a reply the model is unsure of says so, decided on its first few tokens.

llm=ctranslate2 and llm=transformers give each generated token's log-probability; both stream a reply through
:func:`calibrated`, so one rule decides for both. :class:`Calibrator` holds the reply's first sentence
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
from typing import Any, Literal

UNSURE_PREFIX = "I'm not sure, but I think"
DONT_KNOW = "I don't know that one."
WINDOW_TOKENS = 4  # content tokens measured at most: about the first chunk's 4 words. On the answer set 4 hedged as
# well as 8 (mean 0.4: 52 right, 32 confidently wrong, against 52 and 33) and the first words came 0.06 s sooner
Measure = Literal["mean", "min"]
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s*$")
_KEEP_CASE = re.compile(r"^(I\b|I'|[A-Z]{2,}|[A-Z][a-z]*[A-Z])")  # "I", "I'm", "NASA", "McDonald's"
# words that open a question or a request for facts ("What is ...", "Is it ...", "Tell me ...", "Name ...")
_ASKING = re.compile(r"^\W*(what|who|whom|whose|where|when|why|how|which|is|are|was|were|am|do|does|did|can|could|"
                     r"will|would|should|shall|may|might|has|have|had|tell|explain|name|give|list|describe|define)\b",
                     re.IGNORECASE)


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


def asks(text: str) -> bool:
    """The user's words ask for something the reply must know (a question, or "tell me ...", "name ..."): only
    then may a reply be hedged. "Thank you." or "Good morning." gets no "I'm not sure" whatever the confidence."""
    return text.rstrip().endswith("?") or bool(_ASKING.match(text))


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


class CalibratedReplies:
    """What a stage whose backend gives token log-probabilities keeps of ``llm.unsure_below``,
    ``llm.dont_know_below`` and ``llm.unsure_measure`` (conf/llm/_calibrated.yaml), and the calibrator of a reply."""

    unsure_below: float | None = None
    dont_know_below: float | None = None
    unsure_measure: Measure = "mean"

    def calibrator(self, messages: list[dict[str, Any]]) -> Calibrator:
        """A fresh :class:`Calibrator` for the reply to ``messages`` (the last one is the user's words); a reply
        to words that ask nothing (:func:`asks`) is measured but never held nor hedged."""
        question = str(messages[-1].get("content") or "") if messages else ""
        if not asks(question):
            return Calibrator(None, None, self.unsure_measure, question)
        return Calibrator(self.unsure_below, self.dont_know_below, self.unsure_measure, question)


def calibrated(tokens: Iterator[tuple[str, float | None] | Capped], calibrator: Calibrator,
               calls: Any = None) -> Iterator[Any]:
    """A backend's generated tokens as the stage streams them: through the tool-call filter and the calibrator.

    Args:
        tokens: each generated token's text and log-probability, then ``Capped()`` if the reply stopped at the
            token cap; closed when the reply ends early ("I don't know" needs no more tokens), which must stop
            generation.
        calibrator: decides the reply's first sentence (:meth:`CalibratedReplies.calibrator`).
        calls: a ``ToolCallFilter`` when the model has tools: it takes ``<tool_call>`` out of the spoken text, and
            its calls are yielded last.

    Yields:
        Text to speak, the ``Confidence`` once measured, ``Capped()`` (when the cut reply is spoken) and the
        ``ToolCall``s.
    """
    capped = False
    try:
        for token in tokens:
            if isinstance(token, Capped):
                capped = True
                continue
            text, log_prob = token
            for piece in (text,) if calls is None else calls.feed(text):
                yield from calibrator.feed(piece, log_prob)
            if calibrator.stop:
                break
    finally:  # also when the reader closes this generator: the backend stops generating
        tokens.close()  # type: ignore[attr-defined]
    if calls is not None and not calibrator.stop:
        for piece in calls.finish():
            yield from calibrator.feed(piece, None)
    yield from calibrator.finish()
    if capped and not calibrator.stop:
        yield Capped()  # the last word may be cut ("... July 20th, 196cederadio"): the base trims it
    if calls is not None:
        yield from calls.calls

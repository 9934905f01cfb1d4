"""Big Bench Audio's scoring, as the reference system (huggingface/speech-to-speech 1.1.0) scores it.

Text only: a reply becomes an answer token for its category, which is compared with the dataset's official
answer. The reply's closing answer sentence ("Final answer: No", "the answer is 7") is read first, and the first
candidate within the 60 characters after the last such marker wins; with no marker (or nothing gradable after
it) the whole reply is scanned and its last candidate wins, since a reasoning reply states its conclusion last.
A reply with no candidate is unparsed (``correct`` None), which is told apart from a wrong answer. Scores count
errors and unparsed replies against the system: accuracy is right answers over all questions.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

# how each category spells its answers: a choice between labels, or a whole number
CATEGORIES: dict[str, tuple[str, ...]] = {
    "formal_fallacies": ("valid", "invalid"),
    "navigate": ("yes", "no"),
    "object_counting": (),  # a whole number
    "web_of_lies": ("yes", "no"),
}
MARKER = re.compile(r"\b(?:final\s+answer|the\s+answer\s+is|my\s+answer(?:\s+is)?|answer)\b\s*(?:is\s*)?"
                    r"[:\-–—]?\s*", re.IGNORECASE)
TAIL_CHARS = 60  # the answer sentence after a marker; past it, the reply has moved on
# narrow on purpose: "correct" or "negative" are ordinary words in these questions, and a wrong reading is
# worse than none
YES_NO = re.compile(r"\b(?:(?P<yes>yes|yeah|yep|yup)|(?P<no>no|nope|nah))\b", re.IGNORECASE)
VALIDITY = re.compile(r"\b(?:in\s*-?\s*valid|valid)\b", re.IGNORECASE)
# a negation just before a word flips it ("not valid", "is not deductively valid"; not "not sure it is valid")
NEGATED = re.compile(r"\b(?:not|isn't|aren't|never|n't)\b(?:\s+\w+ly)?\s*$", re.IGNORECASE)
NEGATION_WINDOW = 24
NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                "sixteen seventeen eighteen nineteen twenty").split()
NUMBER = re.compile(r"\b(\d{1,3}|" + "|".join(NUMBER_WORDS) + r")\b", re.IGNORECASE)


def _negated(text: str, start: int) -> bool:
    return NEGATED.search(text[max(0, start - NEGATION_WINDOW):start]) is not None


def _candidate(text: str, category: str, first: bool) -> str | None:
    """The first or last answer token for ``category`` in ``text``, normalised (yes/no, valid/invalid, digits)."""
    labels = CATEGORIES[category]
    pattern = NUMBER if not labels else VALIDITY if labels == ("valid", "invalid") else YES_NO
    found = list(pattern.finditer(text))
    if not found:
        return None
    match = found[0] if first else found[-1]
    if not labels:
        word = match.group(1).lower()
        return str(NUMBER_WORDS.index(word)) if word in NUMBER_WORDS else str(int(word))
    if labels == ("valid", "invalid"):
        valid = re.sub(r"[\s-]", "", match.group(0)).lower() == "valid"
        return "invalid" if not valid or _negated(text, match.start()) else "valid"
    said = "yes" if match.group("yes") else "no"
    return ("no" if said == "yes" else "yes") if _negated(text, match.start()) else said


def extract_answer(category: str, reply: str) -> tuple[str | None, str | None]:
    """``(answer, method)`` from a reply: method "marker" (after the last answer marker) or "scan" (the last
    candidate anywhere); ``(None, None)`` when nothing gradable is there or the category is unknown."""
    if category not in CATEGORIES or not reply.strip():
        return None, None
    markers = list(MARKER.finditer(reply))
    if markers:
        end = markers[-1].end()
        if (answer := _candidate(reply[end:end + TAIL_CHARS], category, first=True)) is not None:
            return answer, "marker"
    answer = _candidate(reply, category, first=False)
    return (answer, "scan") if answer is not None else (None, None)


def official(category: str, answer: str) -> str:
    """The dataset's answer in the token space of :func:`extract_answer` ("No" -> "no", "07" -> "7")."""
    return str(int(answer.strip())) if CATEGORIES.get(category) == () else answer.strip().lower()


@dataclass
class Result:
    """One question: what was said back, its answer token and verdict, and the turn's timing."""

    id: int
    category: str
    official_answer: str
    reply: str = ""
    heard: str = ""  # the server's transcript of the question, where it sends one
    extracted: str | None = None
    correct: bool | None = None  # None: unparsed
    method: str | None = None
    first_audio_s: float | None = None  # end of the question's speech -> the reply's first audio
    turn_s: float | None = None  # end of the question's speech -> response.done
    error: str | None = None

    def grade(self) -> Result:
        self.extracted, self.method = extract_answer(self.category, self.reply)
        self.correct = None if self.extracted is None else \
            self.extracted == official(self.category, self.official_answer)
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(results: list[Result]) -> dict[str, Any]:
    """Counts and rates of a group: an errored question is never counted right, and unparsed counts against."""
    total = len(results)
    parsed = sum(result.extracted is not None for result in results)
    correct = sum(result.correct is True and result.error is None for result in results)
    return {"n": total, "errors": sum(result.error is not None for result in results), "parsed": parsed,
            "correct": correct, "accuracy": correct / total if total else None,
            "accuracy_parsed": correct / parsed if parsed else None,
            "parse_rate": parsed / total if total else None}


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None}
    p50, p95 = np.percentile(values, [50, 95])  # linear interpolation, as the reference computes them
    return {"p50": float(p50), "p95": float(p95)}


def aggregate(results: list[Result]) -> dict[str, Any]:
    """Overall and per-category scores, and first-audio and turn time percentiles."""
    return {"totals": summarize(results),
            "by_category": {category: summarize([r for r in results if r.category == category])
                            for category in sorted({r.category for r in results})},
            "first_audio_s": percentiles([r.first_audio_s for r in results if r.first_audio_s is not None]),
            "turn_s": percentiles([r.turn_s for r in results if r.turn_s is not None])}


def table(scores: dict[str, Any]) -> str:
    """The scores as a Markdown table, then the latency line."""

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    rows = ["| category | questions | right | accuracy | parsed | parse rate | errors |",
            "|---|---|---|---|---|---|---|"]
    for name, group in [*scores["by_category"].items(), ("all", scores["totals"])]:
        rows.append(f"| {name} | {group['n']} | {group['correct']} | {rate(group['accuracy'])} | {group['parsed']} "
                    f"| {rate(group['parse_rate'])} | {group['errors']} |")
    first, turn = scores["first_audio_s"], scores["turn_s"]
    rows.append(f"\nend of speech -> first reply audio: p50 {secs(first['p50'])}, p95 {secs(first['p95'])}; "
                f"-> response.done: p50 {secs(turn['p50'])}, p95 {secs(turn['p95'])}")
    return "\n".join(rows)

"""``python -m s2s.bench answers --sweep-unsure``: every calibration threshold scored from one run.

The replies were generated with calibration off; each carries the confidence its first tokens had
(:class:`s2s.llm.calibration.Confidence`). A threshold changes only what is spoken: a reply below
``dont_know_below`` becomes "I don't know that one.", one below ``unsure_below`` is hedged
(:func:`s2s.llm.calibration.hedged`), so scoring the changed text is what a run with that threshold would score
(a follow-up's first reply then differs in the history only). The first words wait for the decision when
calibration is on: they come at the later of the two times.

The best row: the fewest confidently wrong among those with at least the uncalibrated run's right answers
(ties: the most right, then the lowest thresholds).
"""
from __future__ import annotations

from typing import Any

from s2s.bench.answer_set import Question, median, seconds, verdict
from s2s.llm.calibration import DONT_KNOW, hedged

UNSURE_BELOW = (None, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # probabilities: of the first tokens' mean, or their min
MIN_BELOW = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4)
DONT_KNOW_BELOW = (None, 0.1, 0.2, 0.3, 0.4)


def calibrated(reply: str, confidence: dict[str, Any] | None, measure: str, unsure_below: float | None,
               dont_know_below: float | None) -> str:
    """What the stage would have said with these thresholds."""
    if confidence is None or not reply:
        return reply
    value = confidence[measure]
    if dont_know_below is not None and value < dont_know_below:
        return DONT_KNOW
    return hedged(reply) if unsure_below is not None and value < unsure_below else reply


def score(items: list[Question], rows: list[dict[str, Any]], measure: str, unsure_below: float | None,
          dont_know_below: float | None) -> dict[str, Any]:
    counts = {"right": 0, "wrong": 0, "unsure": 0}
    first_words = []
    for question, row in zip(items, rows):
        counts[verdict(calibrated(row["reply"], row["confidence"], measure, unsure_below, dont_know_below),
                       question)] += 1
        decided = (row["confidence"] or {}).get("decided_s") if unsure_below or dont_know_below else None
        first_words.append(max(filter(None, (row["first_words_s"], decided)), default=None))

    return {"measure": measure, "unsure_below": unsure_below, "dont_know_below": dont_know_below, **counts,
            "first_words_median_s": median(first_words)}


def sweep(items: list[Question], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every threshold's scores, printed as a table with the best row marked; returned for answers.json."""

    grid = [(measure, unsure, dont_know) for measure, unsures in (("mean", UNSURE_BELOW), ("min", MIN_BELOW))
            for unsure in unsures for dont_know in DONT_KNOW_BELOW
            if dont_know is None or (unsure is not None and dont_know < unsure)]
    results = [score(items, rows, *point) for point in grid]
    baseline = results[0]  # calibration off
    allowed = [result for result in results if result["right"] >= baseline["right"]]
    best = min(allowed, key=lambda r: (r["wrong"], -r["right"], r["unsure_below"] or 0, r["dont_know_below"] or 0))
    total = max(1, len(rows))
    print("| measure | unsure_below | dont_know_below | right | confidently wrong | unsure | first 5 words |")
    print("|---|---|---|---|---|---|---|")
    for result in results:
        cells = [f"{result[name]} ({100 * result[name] / total:.0f}%)" for name in ("right", "wrong", "unsure")]
        print(f"| {result['measure']} | {result['unsure_below']} | {result['dont_know_below']} | "
              f"{' | '.join(cells)} | {seconds(result['first_words_median_s'])} |"
              f"{' **best**' if result is best else ''}")
    best["best"] = True
    return results

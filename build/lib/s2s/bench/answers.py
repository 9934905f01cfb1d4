"""python -m s2s.bench answers [key=value ...] [--sweep-unsure]: the composed config's LLM stage alone, asked the
answer set.

Only the LLM stage is built (from the config composed as run.py composes it: platform detected, overrides
applied), set up and warmed up as the runner would; each item is its own conversation (a follow-up's turns share
one). Each reply is scored three ways (:func:`s2s.bench.answer_set.verdict`): right, confidently wrong or unsure;
the run prints each, then the three as counts and percentages, the median time to the reply's first 5 words and
the process's peak memory. ``--sweep-unsure`` runs the set once with calibration off and scores every threshold
of ``llm.unsure_below`` / ``llm.dont_know_below`` on the confidence each reply reported
(:mod:`s2s.bench.unsure_sweep`).
"""
from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from s2s.bench.answer_set import ANSWER_SET, Question, median, seconds, verdict

FIRST_WORDS = 5
VERDICTS = ("right", "wrong", "unsure")  # wrong: confidently wrong


class StreamClock:
    """Wraps the stage's ``stream`` to time its raw text: when the first ``FIRST_WORDS`` words have streamed."""

    def __init__(self, stage: Any) -> None:
        self.stream = stage.stream
        self.start = 0.0
        self.first_words_s: float | None = None

    def __call__(self, messages: list[dict[str, Any]]) -> Iterator[Any]:
        text = ""
        pieces = self.stream(messages)
        try:
            for piece in pieces:
                if isinstance(piece, str):
                    text += piece
                    if self.first_words_s is None and len(text.split()) >= FIRST_WORDS:
                        self.first_words_s = time.perf_counter() - self.start
                yield piece
        finally:
            pieces.close()
            if self.first_words_s is None and text.strip():  # a reply shorter than that: its end
                self.first_words_s = time.perf_counter() - self.start


def ask(stage: Any, clock: StreamClock, question: Question) -> dict[str, Any]:
    """The item's turns in one conversation; the last reply, its timing and its confidence (when reported)."""
    from s2s.messages import Metric, ReplyText, Transcript

    stage.reset()
    for turn, text in enumerate(question.turns):
        chunks: list[str] = []
        confidence: dict[str, Any] | None = None
        first_chunk_s = None
        clock.start, clock.first_words_s = time.perf_counter(), None
        for message in stage.process(Transcript(text, turn, "en")):
            if isinstance(message, ReplyText):
                first_chunk_s = first_chunk_s or time.perf_counter() - clock.start
                chunks.append(message.text)
            elif isinstance(message, Metric) and message.name == "llm_confidence":
                confidence = {"mean": message.extra["mean"], "min": message.extra["min"], "decided_s": message.value}
    return {"question": " / ".join(question.turns), "kind": question.kind, "reply": " ".join(chunks),
            "first_words_s": clock.first_words_s, "first_chunk_s": first_chunk_s, "confidence": confidence}


def tally(verdicts: Sequence[str]) -> str:
    """"right 60 (54%), confidently wrong 30 (27%), unsure 21 (19%)"."""
    counts, total = Counter(verdicts), max(1, len(verdicts))
    return ", ".join(f"{'confidently wrong' if name == 'wrong' else name} {counts[name]} "
                     f"({100 * counts[name] / total:.0f}%)" for name in VERDICTS)


def _questions(items: Sequence[Question | tuple[str, tuple[str, ...]]]) -> list[Question]:
    return [item if isinstance(item, Question) else Question(item[0], tuple(item[1])) for item in items]


def bench_answers(overrides: list[str], questions: Sequence[Question | tuple[str, tuple[str, ...]]] = ANSWER_SET,
                  sweep_unsure: bool = False) -> int:
    from s2s.bench.compose import composed, stage_spec
    from s2s.config_errors import ConfigErrors
    from s2s.platform import peak_memory_mb
    from s2s.resolvers import fresh_dir

    items = _questions(questions)
    output_dir = Path(fresh_dir(time.strftime("outputs/%Y-%m-%d/%H-%M-%S-answers")))
    # the sweep scores every threshold on replies generated with calibration off (after the user's overrides)
    run_overrides = [*overrides, "llm.unsure_below=null", "llm.dont_know_below=null"] if sweep_unsure else overrides
    cfg = composed(run_overrides, output_dir)
    try:
        spec = stage_spec(cfg, "llm")
    except ConfigErrors as errors:
        for error in errors.errors:
            print(f"config error: {error}", file=sys.stderr)
        return 2
    stage = spec.build()
    stage.setup()
    try:
        if cfg.runner.warm_up:
            stage.warm_up()
        clock = StreamClock(stage)
        stage.stream = clock  # process() calls it: the raw text is timed where it streams
        rows = []
        for question in items:
            row = ask(stage, clock, question)
            row["verdict"] = verdict(row["reply"], question)
            row["hit"] = row["verdict"] == "right"
            rows.append(row)
            print(f"[{row['verdict']:6}] {seconds(row['first_words_s'])}  {row['question']} -> {row['reply']}",
                  flush=True)
    finally:
        stage.close()
    hits = sum(row["hit"] for row in rows)
    counts = Counter(row["verdict"] for row in rows)
    summary = {"target": spec.target, "overrides": run_overrides, "score": hits / len(rows), "hits": hits,
               "questions": len(rows), **{name: counts[name] for name in VERDICTS},
               "first_words_median_s": median([row["first_words_s"] for row in rows]),
               "first_chunk_median_s": median([row["first_chunk_s"] for row in rows]),
               "peak_memory_mb": peak_memory_mb(), "torch_loaded": "torch" in sys.modules}
    print(f"{tally([row['verdict'] for row in rows])} of {len(rows)}; first {FIRST_WORDS} words median "
          f"{seconds(summary['first_words_median_s'])}, first chunk median "
          f"{seconds(summary['first_chunk_median_s'])}; peak memory {summary['peak_memory_mb']} MiB; "
          f"torch {'loaded' if summary['torch_loaded'] else 'not loaded'} ({spec.target}"
          f"{' ' + ' '.join(run_overrides) if run_overrides else ''})")
    result: dict[str, Any] = {"summary": summary, "rows": rows}
    if sweep_unsure:
        from s2s.bench.unsure_sweep import sweep

        result["sweep"] = sweep(items, rows)
    (output_dir / "answers.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"answers.json in {output_dir.resolve()}")
    return 0

"""python -m s2s.bench answers [key=value ...]: the composed config's LLM stage alone, asked the answer set.

Only the LLM stage is built (from the config composed as run.py composes it: platform detected, overrides
applied), set up and warmed up as the runner would; each question is its own conversation. For each it prints
hit or miss (a key word of a right answer in the spoken reply, :mod:`s2s.bench.questions`), the time to the
reply's first 5 words and the reply; then the score (fraction hit), the medians and the process's peak memory.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from s2s.bench.questions import QUESTIONS, hit

FIRST_WORDS = 5


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


def ask(stage: Any, clock: StreamClock, turn: int, question: str) -> dict[str, Any]:
    from s2s.messages import ReplyText, Transcript

    stage.reset()
    chunks: list[str] = []
    first_chunk_s = None
    clock.start, clock.first_words_s = time.perf_counter(), None
    for message in stage.process(Transcript(question, turn, "en")):
        if isinstance(message, ReplyText):
            first_chunk_s = first_chunk_s or time.perf_counter() - clock.start
            chunks.append(message.text)
    return {"question": question, "reply": " ".join(chunks), "first_words_s": clock.first_words_s,
            "first_chunk_s": first_chunk_s}


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if row[key] is not None]
    return statistics.median(values) if values else None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def bench_answers(overrides: list[str], questions: list[tuple[str, tuple[str, ...]]] = QUESTIONS) -> int:
    from s2s.bench.compose import composed, stage_spec
    from s2s.config_errors import ConfigErrors
    from s2s.platform import peak_memory_mb
    from s2s.resolvers import fresh_dir

    output_dir = Path(fresh_dir(time.strftime("outputs/%Y-%m-%d/%H-%M-%S-answers")))
    cfg = composed(overrides, output_dir)
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
        for turn, (question, keys) in enumerate(questions):
            row = ask(stage, clock, turn, question)
            row["hit"] = hit(row["reply"], keys)
            rows.append(row)
            print(f"[{'hit ' if row['hit'] else 'miss'}] {_seconds(row['first_words_s'])}  {question} -> "
                  f"{row['reply']}", flush=True)
    finally:
        stage.close()
    hits = sum(row["hit"] for row in rows)
    summary = {"target": spec.target, "overrides": overrides, "score": hits / len(rows), "hits": hits,
               "questions": len(rows), "first_words_median_s": _median(rows, "first_words_s"),
               "first_chunk_median_s": _median(rows, "first_chunk_s"), "peak_memory_mb": peak_memory_mb(),
               "torch_loaded": "torch" in sys.modules}
    line = (f"score {hits}/{len(rows)} = {summary['score']:.2f}; first {FIRST_WORDS} words median "
            f"{_seconds(summary['first_words_median_s'])}, first chunk median "
            f"{_seconds(summary['first_chunk_median_s'])}; peak memory {summary['peak_memory_mb']} MiB; "
            f"torch {'loaded' if summary['torch_loaded'] else 'not loaded'} ({spec.target}"
            f"{' ' + ' '.join(overrides) if overrides else ''})")
    print(line)
    (output_dir / "answers.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")
    print(f"answers.json in {output_dir.resolve()}")
    return 0

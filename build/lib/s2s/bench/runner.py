"""The runner's own overhead: messages through a chain of stages that do nothing, on the real ``Graph``.

Two passes: paced (one message in flight, so each hop is a bare queue hand-over between threads) for
latency, and unpaced (the source floods the chain) for throughput.
"""
from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from s2s.graph import Graph
from s2s.messages import Data, Message, Metric, ReplyText
from s2s.stage import Source, Stage


class CountingSource(Source):
    """Emits ``count`` small messages, ``interval_s`` apart (0: as fast as the queue takes them)."""

    def __init__(self, count: int, interval_s: float = 0.0) -> None:
        self.count, self.interval_s = count, interval_s

    def stream(self) -> Iterator[Message]:
        for index in range(self.count):
            if self.interval_s:
                time.sleep(self.interval_s)
            yield ReplyText("x", index)


class PassThrough(Stage):
    """Forwards every message unchanged: what is measured is the runner alone."""

    accepts = (ReplyText,)

    def process(self, message: Data) -> Iterator[Message]:
        yield message


class HopTimer:
    """Graph observer recording when each stage emits and receives each message (keyed by turn)."""

    def __init__(self, stages: int, count: int) -> None:
        self.emitted = [[0.0] * count for _ in range(stages)]
        self.received = [[0.0] * count for _ in range(stages)]
        self.last_done = 0.0
        self._last = stages - 1
        self._lock = threading.Lock()

    def on_input(self, stage: str, message: Data, now: float) -> None:
        self.received[int(stage)][message.turn] = now  # type: ignore[attr-defined]

    def on_done(self, stage: str, message: Data, now: float) -> None:
        if int(stage) == self._last:
            with self._lock:
                self.last_done = max(self.last_done, now)

    def on_output(self, stage: str, message: Message, now: float) -> None:
        if isinstance(message, ReplyText):
            self.emitted[int(stage)][message.turn] = now

    def on_metric(self, stage: str, metric: Metric) -> None: ...


@dataclass
class RunnerFigures:
    """Results in seconds (latencies) and messages per second (throughput)."""

    messages: int
    stages: int
    hop_p50_s: float
    hop_p99_s: float
    end_to_end_p50_s: float
    end_to_end_p99_s: float
    throughput_per_s: float
    flood_s: float


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def _run(count: int, stages: int, interval_s: float) -> tuple[HopTimer, float]:
    timer = HopTimer(stages, count)
    chain: list[tuple[str, Stage]] = [("0", CountingSource(count, interval_s))]
    chain += [(str(index), PassThrough()) for index in range(1, stages)]
    graph = Graph(chain, timer)
    graph.setup()
    start = time.perf_counter()
    result = graph.run()
    graph.close()
    if result.failure:
        raise RuntimeError(str(result.failure))
    return timer, timer.last_done - start


def bench_runner(messages: int = 1000, stages: int = 8, interval_s: float = 0.001) -> RunnerFigures:
    """Push ``messages`` through ``stages`` stages (the source included) and measure the hand-overs."""
    if messages < 1 or stages < 2:
        raise ValueError("need at least 1 message and 2 stages (a source and one more)")
    paced, _ = _run(messages, stages, interval_s)
    hops = [paced.received[k + 1][m] - paced.emitted[k][m] for k in range(stages - 1) for m in range(messages)]
    ends = [paced.received[stages - 1][m] - paced.emitted[0][m] for m in range(messages)]
    _, flood_s = _run(messages, stages, 0.0)
    return RunnerFigures(messages, stages, _percentile(hops, 50), _percentile(hops, 99), _percentile(ends, 50),
                         _percentile(ends, 99), messages / flood_s if flood_s > 0 else float("inf"), flood_s)


def report(figures: RunnerFigures) -> str:
    def us(seconds: float) -> str:
        return f"{seconds * 1e6:.0f} us"

    return "\n".join([
        f"runner: {figures.messages} messages through {figures.stages} stages "
        f"(s2s.graph.Graph, one thread and queue per stage, stages that do nothing)",
        f"  per-hop latency      p50 {us(figures.hop_p50_s)}  p99 {us(figures.hop_p99_s)}"
        "   (paced: one message in flight)",
        f"  source -> last stage p50 {us(figures.end_to_end_p50_s)}  p99 {us(figures.end_to_end_p99_s)}"
        f"   ({figures.stages - 1} hops)",
        f"  throughput           {figures.throughput_per_s:,.0f} messages/s   "
        f"(unpaced: all {figures.messages} in {figures.flood_s:.3f} s)",
    ])

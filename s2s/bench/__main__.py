"""python -m s2s.bench runner [--messages N] [--stages K]: the runner's per-hop latency and throughput.

The TTS benchmark is a config group instead, so it sweeps like everything else: python run.py -m bench=tts tts=...
"""
from __future__ import annotations

import argparse
import sys

from s2s.bench.runner import bench_runner, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m s2s.bench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("runner", help="messages through a chain of stages that do nothing")
    runner.add_argument("--messages", type=int, default=1000, help="messages per pass (default 1000)")
    runner.add_argument("--stages", type=int, default=8, help="stages in the chain, source included (default 8)")
    runner.add_argument("--interval-ms", type=float, default=1.0,
                        help="gap between messages in the latency pass (default 1 ms: one message in flight)")
    args = parser.parse_args(argv)
    try:
        figures = bench_runner(args.messages, args.stages, args.interval_ms / 1000)
    except ValueError as error:
        parser.error(str(error))
    print(report(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

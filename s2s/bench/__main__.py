"""python -m s2s.bench runner [--messages N] [--stages K]: the runner's per-hop latency and throughput.

python -m s2s.bench server --sessions N --seconds T: a bounded load on the realtime server (loopback only);
    --transport both: voice-to-voice over WebRTC against WebSocket, in one interleaved run.

python -m s2s.bench latency [FILES...] [key=value ...] [--versus "key=value ..."]: voice-to-voice from the end of
speech, realtime-paced; --versus runs every file a second time with more overrides, interleaved, for a ratio.

python -m s2s.bench recognition [key=value ...] [--versus "key=value ..."]...: the STT's word error rate on a
recognition set (espeak-ng voices and rates, real recordings) against its time, for each variant.

python -m s2s.bench turns [key=value ...] [--variant "key=value ..."]... [--set all|real|espeak]: cut-offs in a
pause and the endpoint after a complete turn, on real people's recordings and espeak-ng, for turn=silence,
smart_turn and words (or the variants given), on the VAD (turn=words and fused add the STT and LLM).

python -m s2s.bench answers [key=value ...] [--sweep-unsure]: the LLM stage alone on the answer set (110 spoken-style
questions with the key words of a right answer): right, confidently wrong or unsure per question and in all, the
first-5-words latency, peak memory; --sweep-unsure scores the calibration thresholds from the same run.

python -m s2s.bench bba --data FOLDER [--url ws://...] [--limit N]: Big Bench Audio (spoken reasoning questions in
the dataset's layout) through a realtime server, ours by default: accuracy and parse rate per category, time to
first audio and turn time.

python -m s2s.bench pipecat --python PIPECAT_PYTHON [--rounds N] [FILES...] [key=value ...]: ours against pipecat
1.14 on the same models and files, interleaved in one run (the pipecat venv: scripts/pipecat-venv.sh).

python -m s2s.bench startup [--rounds N]: `s2s --cfg job` against a bare @hydra.main app on the same configs,
interleaved; prints both medians and their ratio.

The TTS benchmark is a config option instead (conf/experiment/), so it sweeps like everything else:
python run.py -m experiment=tts_benchmark tts=...
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from s2s.bench.answers import bench_answers
from s2s.bench.bba import add_arguments as add_bba_arguments
from s2s.bench.bba import bench_bba
from s2s.bench.latency import bench_latency
from s2s.bench.recognition import bench_recognition
from s2s.bench.runner import bench_runner, report
from s2s.bench.server import add_arguments as add_server_arguments
from s2s.bench.server import bench_server
from s2s.bench.transports import bench_transports
from s2s.bench.turns import bench_turns


def main(argv: list[str] | None = None) -> int:
    from s2s.platform import fix_allocator

    fix_allocator()  # as every s2s process does before loading a model (see s2s.platform)
    parser = argparse.ArgumentParser(prog="python -m s2s.bench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("runner", help="messages through a chain of stages that do nothing")
    runner.add_argument("--messages", type=int, default=1000, help="messages per pass (default 1000)")
    runner.add_argument("--stages", type=int, default=8, help="stages in the chain, source included (default 8)")
    runner.add_argument("--interval-ms", type=float, default=1.0,
                        help="gap between messages in the latency pass (default 1 ms: one message in flight)")
    server = commands.add_parser("server", help="a bounded load on the realtime server (loopback only)")
    add_server_arguments(server)
    latency = commands.add_parser("latency", help="voice-to-voice from the end of speech on the composed pipeline")
    latency.add_argument("inputs", nargs="*", metavar="FILE|key=value",
                         help="speech files (default: the bundled sample and espeak-ng questions) and config "
                              "overrides such as tts=kokoro_onnx vad.min_silence_ms=500")
    latency.add_argument("--trailing-s", type=float, default=2.0,
                         help="silence fed after each file (default 2 s; the reply is measured, not heard out)")
    latency.add_argument("--versus", metavar="'key=value ...'", type=str.split, default=None,
                         help="also run every file with these overrides added (interleaved) and print the ratio")
    recognition = commands.add_parser("recognition", help="the STT's word error rate and time on a recognition set")
    recognition.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. stt.beam_size=1")
    recognition.add_argument("--versus", metavar="'key=value ...'", type=str.split, action="append", default=[],
                             help="another variant: these overrides added (repeatable); variants take turns")
    recognition.add_argument("--clips", type=int, default=None, help="only the first N clips (a quick check)")
    answers = commands.add_parser("answers", help="the LLM stage alone on the answer set: score and latency")
    answers.add_argument("overrides", nargs="*", metavar="key=value",
                         help="config overrides such as llm=ctranslate2 llm.compute_type=float32")
    answers.add_argument("--sweep-unsure", action="store_true",
                         help="generate with calibration off and score llm.unsure_below / llm.dont_know_below "
                              "thresholds on each reply's confidence")
    turns = commands.add_parser("turns", help="cut-offs in a pause and endpoints: turn=fused, silence, smart_turn, "
                                              "words")
    turns.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every variant")
    turns.add_argument("--variant", metavar="'key=value ...'", type=str.split, action="append", default=[],
                       help="a variant's overrides (repeatable; default: turn=silence, smart_turn, words)")
    turns.add_argument("--set", dest="which", choices=("all", "real", "espeak"), default="all",
                       help="real people's recordings, espeak-ng questions, or both (default)")
    turns.add_argument("--speech-dir", type=Path, default=None,
                       help="the real-speech archives (default: .cache/real-speech, which scripts/setup.sh test "
                            "fills)")
    turns.add_argument("--verdict-delay-s", type=float, default=None,
                       help="the words' verdict reaches the VAD this long after the speculative segment (default: "
                            "the wall time STT and scoring took here; 0: an instant verdict, the most cut-offs)")
    bba = commands.add_parser("bba", help="Big Bench Audio through a realtime server (ours by default)")
    add_bba_arguments(bba)
    pipecat = commands.add_parser("pipecat", help="ours against pipecat on the same models and files, interleaved")
    pipecat.add_argument("inputs", nargs="*", metavar="FILE|key=value",
                         help="speech files (default: the bundled sample and the 12 real recordings) and config "
                              "overrides for our side, such as turn=silence")
    pipecat.add_argument("--python", required=True,
                         help="the pipecat venv's Python (scripts/pipecat-venv.sh: .cache/pipecat-venv/bin/python)")
    pipecat.add_argument("--rounds", type=int, default=2, help="passes over the files (default 2)")
    pipecat.add_argument("--trailing-s", type=float, default=2.0, help="silence fed after each file (default 2 s)")
    pipecat.add_argument("--pipecat-turn", choices=("smart_turn", "speech_timeout"), default="smart_turn",
                         help="pipecat's stop strategy: its default Smart Turn v3, or its silence timeout")
    pipecat.add_argument("--reply-timeout-s", type=float, default=20.0,
                         help="how long pipecat may take to answer after the file ends (default 20 s)")
    startup = commands.add_parser("startup", help="s2s --cfg job against a bare @hydra.main app, paired")
    startup.add_argument("--rounds", type=int, default=10, help="runs of each, interleaved (default 10)")
    args = parser.parse_args(argv)
    if args.command == "startup":
        from s2s.bench.startup import bench_startup

        return bench_startup(args.rounds)
    if args.command == "turns":
        return bench_turns(args.overrides, args.variant, args.which, args.speech_dir, args.verdict_delay_s)
    if args.command in ("recognition", "answers"):
        extra = sum(args.versus, []) if args.command == "recognition" else []
        if bad := [item for item in [*args.overrides, *extra] if "=" not in item]:
            parser.error(f"{args.command} takes key=value overrides, got {' '.join(bad)!r}")
        return bench_recognition(args.overrides, args.versus, args.clips) if args.command == "recognition" \
            else bench_answers(args.overrides, sweep_unsure=args.sweep_unsure)
    if args.command == "latency":
        overrides = [item for item in args.inputs if "=" in item]
        if args.versus is not None and not all("=" in item for item in args.versus):
            parser.error(f"--versus takes key=value overrides, got {' '.join(args.versus)!r}")
        try:
            return bench_latency([item for item in args.inputs if "=" not in item], overrides, args.trailing_s,
                                 args.versus)
        except ValueError as error:
            parser.error(str(error))
    if args.command == "pipecat":
        from s2s.bench.pipecat_side import bench_pipecat

        if args.rounds < 1:
            parser.error("--rounds takes 1 or more")
        try:
            return bench_pipecat(args.python, [item for item in args.inputs if "=" not in item],
                                 [item for item in args.inputs if "=" in item], args.rounds, args.trailing_s,
                                 args.pipecat_turn, args.reply_timeout_s)
        except ValueError as error:
            parser.error(str(error))
    if args.command == "bba":
        try:
            return bench_bba(args)
        except ValueError as error:
            parser.error(str(error))
    if args.command == "server":
        try:
            return bench_transports(args) if args.transport == "both" else bench_server(args)
        except ValueError as error:
            parser.error(str(error))
    try:
        figures = bench_runner(args.messages, args.stages, args.interval_ms / 1000)
    except ValueError as error:
        parser.error(str(error))
    print(report(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

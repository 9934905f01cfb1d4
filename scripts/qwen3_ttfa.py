"""Qwen3-TTS torch backend on a CUDA GPU: time to first audio through s2s against the bare library.

    python scripts/qwen3_ttfa.py [--rounds N] [--out FOLDER]

No hub is reachable, so the checkpoints are random: the tests' tiny one and one with the released 0.6B
transformer sizes (talker 28 layers of 1024, code predictor 5; tiny text vocabulary and codec), which costs a
0.6B model's compute per codec step. For each, interleaved over the rounds:

* ``library``: faster-qwen3-tts itself, ``generate_custom_voice_streaming`` to its first chunk;
* ``stage``: s2s's tts=qwen3_torch stage (composed with the platform detected, as a user gets it) to its first block;
* ``stage_eager``: the same with ``tts.attn_implementation=eager``, the reference system's default;

then ``runner``: ``python run.py`` with sentences -> tts -> discard on the same checkpoint, its
``tts_first_audio_s`` per turn from metrics.json. Prints medians and the stage/library ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEXT = "Hello there, how can I help you today?"
CHUNK = 8  # codec steps per streamed chunk: the faster-qwen3-tts default
STEPS = 64


def _to_first_block(start: Callable[[], Generator]) -> float:
    """Seconds from starting a stream to its first block; the stream is then closed, as the runner does."""
    began = time.perf_counter()
    blocks = start()
    next(blocks)
    took = time.perf_counter() - began
    blocks.close()
    return took


def _library(model_dir: Path) -> Callable[[], float]:
    import torch
    from faster_qwen3_tts import FasterQwen3TTS

    model = FasterQwen3TTS.from_pretrained(str(model_dir), device="cuda", dtype=torch.bfloat16, backend="torch",
                                           max_seq_len=2048)
    model.warmup()
    return lambda: _to_first_block(lambda: model.generate_custom_voice_streaming(
        text=TEXT, language="English", speaker="ryan", max_new_tokens=STEPS, chunk_size=CHUNK))


def _overrides(model_dir: Path) -> list[str]:
    return ["tts=qwen3_torch", f"tts.model={model_dir}", "tts.speaker=ryan", f"tts.streaming_chunk_size={CHUNK}",
            f"tts.max_new_tokens={STEPS}"]


def _stage(model_dir: Path, *extra: str) -> Callable[[], float]:
    from s2s.compose import compose, prepare_argv
    from s2s.config import validate
    from s2s.messages import ReplyText

    spec = next(s for s in validate(compose(prepare_argv([*_overrides(model_dir), *extra]), "/nonexistent",
                                               hydra_node=False))
                if s.group == "tts")
    stage = spec.build()
    stage.setup()
    print(f"  stage: {stage.describe()}", flush=True)
    return lambda: _to_first_block(lambda: stage.process(ReplyText(TEXT, 0, "en")))


def _runner(model_dir: Path, out: Path) -> list[float]:
    run_dir = out / f"run-{model_dir.name}"
    sentences = "[" + ",".join([f"'{TEXT}'"] * 5) + "]"
    command = [sys.executable, str(ROOT / "run.py"), "source=sentences", "sink=discard",
               "pipeline=[source,tts,sink]", f"source.sentences={sentences}", *_overrides(model_dir),
               f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode:
        print(done.stdout[-3000:], done.stderr[-3000:])
        return []
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return [turn["timings"]["tts_first_audio_s"] for turn in metrics["turns"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("/tmp/qwen3_ttfa"))
    args = parser.parse_args()
    from tests.fixtures import qwen3 as fixtures

    import torch

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    for name, options in (("tiny", {}), ("0.6B-shaped", {"shape": fixtures.SHAPE_0_6B, "std": 0.02})):
        model_dir = fixtures.build_tiny_qwen3_tts(args.out / name, "custom_voice", decoder_upsample=8, **options)
        print(f"{name}: built {model_dir}", flush=True)
        firsts = {"library": _library(model_dir), "stage": _stage(model_dir),
                  "stage_eager": _stage(model_dir, "tts.attn_implementation=eager")}
        times: dict[str, list[float]] = {key: [] for key in firsts}
        for _ in range(args.rounds):
            for key, first in firsts.items():
                times[key].append(first())
        times["runner"] = _runner(model_dir, args.out)
        medians = {key: statistics.median(values) if values else float("nan") for key, values in times.items()}
        print(f"{name}: time to first audio, medians of {args.rounds} interleaved (runner: 5 turns): "
              + ", ".join(f"{key} {value * 1000:.1f} ms" for key, value in medians.items())
              + f"; stage/library {medians['stage'] / medians['library']:.2f}x"
              + f", stage_eager/library {medians['stage_eager'] / medians['library']:.2f}x", flush=True)
        print(f"  all: {json.dumps({k: [round(v, 4) for v in vs] for k, vs in times.items()})}", flush=True)
        del firsts
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

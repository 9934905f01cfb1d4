"""python -m s2s.bench pipecat --python PIPECAT_PYTHON [--rounds N] [FILES...] [key=value ...]: ours against pipecat.

Both pipelines hear the same files, realtime-paced in the same chunks with the same trailing silence, on the same
models: faster-whisper from the folder our ``stt=faster_whisper`` resolves to, our LLM stage (served to pipecat's
``OpenAILLMService`` by :mod:`s2s.bench.chat_server` on 127.0.0.1), and our Piper voice (said by our ``PiperTTS``
stage inside a pipecat ``TTSService``). Ours runs as ``python -m s2s.bench latency`` runs it (one run of the real
runner per file, :func:`s2s.bench.latency.run_pipeline`); pipecat's in the pipecat venv
(``scripts/pipecat-venv.sh``), one fresh pipeline per file (:mod:`s2s.bench.pipecat_agent`). For each round and
file the two run back to back, the first of them alternating.

One measure for both: true voice-to-voice, from the end of the user's speech (the last sample above 2% of the
file's peak and six times its noise floor, :func:`s2s.bench.server.speech_end_s`) to the first audible reply
sample out of the pipeline, both on the input clock. A reply that starts before the end of speech is a cut-off
(a pause taken for the end of the turn); the figure is then the first reply that starts after it.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from s2s import audio
from s2s.bench.latency import LEAD_S, run_pipeline, write_input
from s2s.bench.server import speech_end_s
from s2s.bench.speech import Clip
from s2s.platform import cpu_description

RATE = 16000
ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 300.0  # pipecat's imports and the models, on a busy machine


def default_clips() -> list[Clip]:
    """The bundled question and the 12 real recordings (complete) that ``scripts/setup.sh test`` fetches; without
    them, the recordings that installed packages ship."""
    from s2s.bench import real_speech
    from s2s.bench.speech import recordings
    from s2s.resolvers import sample

    clips = [Clip("question.wav (bundled)", audio.read_audio(sample("question.wav"), RATE))]
    if real_speech.missing(real_speech.FOLDER):
        print(f"note: {real_speech.missing_message(real_speech.FOLDER)}; using the packages' recordings instead")
        return clips + recordings()
    return clips + [Clip(item.name, item.samples, item.text) for item in real_speech.recordings()]


def measured(onsets: list[float], speech_end: float) -> tuple[float | None, list[float]]:
    """(voice-to-voice: the first reply onset at or after the end of speech, less that end, or None; the cut-offs:
    each earlier onset, as seconds before the end, negative)."""
    after = [at for at in sorted(onsets) if at >= speech_end]
    return (round(after[0] - speech_end, 4) if after else None,
            [round(at - speech_end, 4) for at in sorted(onsets) if at < speech_end])


def our_onsets(metrics: dict[str, Any]) -> list[float]:
    """When each of our turns' first reply sound reached the sink, on the input clock."""
    return [turn["timings"]["first_audio_at_s"] for turn in metrics.get("turns") or []
            if turn["timings"].get("first_audio_at_s") is not None]


class PipecatAgent:
    """The pipecat side in its own venv's Python: started once, one file per request, stopped by ``close``."""

    def __init__(self, python: str, arguments: list[str], log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        self._log = log.open("w")
        self.log_path = log
        self._process = subprocess.Popen([python, "-m", "s2s.bench.pipecat_agent", *arguments], cwd=ROOT, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                         text=True, bufsize=1)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def expect(self, prefix: str, timeout_s: float) -> dict[str, Any]:
        """The JSON after the next line that starts with ``prefix``; RuntimeError on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise RuntimeError(f"the pipecat agent exited (code {self._process.wait(5)}): "
                                   f"{self._tail()}")
            if line.startswith(prefix + " "):
                return json.loads(line[len(prefix) + 1:])
        raise RuntimeError(f"the pipecat agent said nothing for {timeout_s:.0f} s: {self._tail()}")

    def run(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        return self.expect("RESULT", timeout_s)

    def _tail(self) -> str:
        self._log.flush()
        return "..." + self.log_path.read_text(errors="replace")[-1500:]

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                if self._process.stdin:
                    self._process.stdin.close()  # it ends at the end of its input
                self._process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._process.terminate()
                try:
                    self._process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait(timeout=5)
        self._log.close()


def sides(cfg: Any) -> dict[str, Any]:
    """What the pipecat side needs of the composed config: the model files and settings ours uses."""
    from s2s.stt.faster_whisper import resolve_model
    from s2s.tts.piper import voice_paths

    if cfg.stt._target_ != "s2s.stt.faster_whisper.FasterWhisperSTT" or cfg.tts._target_ != "s2s.tts.piper.PiperTTS":
        raise ValueError("the pipecat side mirrors stt=faster_whisper and tts=piper (the embedded default): "
                         f"this config has {cfg.stt._target_} and {cfg.tts._target_}")
    whisper = resolve_model(cfg.stt.model, cfg.cache_dir)
    if not Path(whisper).is_dir():
        raise ValueError(f"stt.model={cfg.stt.model} resolves to no local folder ({whisper}): no model hub here")
    compute = cfg.stt.compute_type
    piper = {key: cfg.tts[key] for key in ("speaker", "speed", "noise_scale", "noise_w", "sentence_silence_s")}
    return {"whisper": whisper, "compute_type": "int8" if compute == "default" else compute,
            "voice": str(voice_paths(cfg.tts.model)[0]), "piper": piper, "system_prompt": cfg.llm.system_prompt,
            "chunk_ms": int(cfg.source.chunk_ms)}


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _cuts(values: list[float]) -> str:
    return ", ".join(f"{value:+.2f}" for value in values) or "-"


def report(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = ["| round | file | ours | pipecat | ours cut-offs | pipecat cut-offs | ours heard | pipecat heard |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['round']} | {row['file']} | {_cell(row['ours'])} | {_cell(row['pipecat'])} | "
                     f"{_cuts(row['ours_cutoffs'])} | {_cuts(row['pipecat_cutoffs'])} | {row['ours_transcript']} | "
                     f"{row['pipecat_transcript']} |")
    medians = {}
    lines.append("")
    for side in ("ours", "pipecat"):
        values = [row[side] for row in rows if row[side] is not None]
        cut = sum(bool(row[f"{side}_cutoffs"]) for row in rows)
        missing = sum(row[side] is None for row in rows)
        split = sum(row[f"{side}_turns"] > 1 for row in rows)
        if values:
            medians[side] = float(np.percentile(values, 50))
            lines.append(f"{side}: voice-to-voice p50 {medians[side]:.2f} s, p90 {np.percentile(values, 90):.2f} s "
                         f"({len(values)} replies; {cut} files with a cut-off, {split} heard as more than one turn, "
                         f"{missing} with no reply after the end of speech)")
        else:
            lines.append(f"{side}: no reply after the end of speech in any file")
    if len(medians) == 2:
        lines.append(f"ratio of medians, ours / pipecat: {medians['ours'] / medians['pipecat']:.2f} "
                     "(same run, interleaved)")
    lines.append(f"machine: {meta['machine']}; load average {meta['load_before']} before, {meta['load_after']} "
                 f"after; pipecat side: {meta['pipecat']}")
    return "\n".join(lines)


def bench_pipecat(python: str, files: list[str], overrides: list[str], rounds: int, trailing_s: float,
                  turn: str = "smart_turn", reply_timeout_s: float = 20.0) -> int:
    from s2s.bench.chat_server import ChatServer
    from s2s.bench.compose import composed, set_up
    from s2s.resolvers import fresh_dir

    if not Path(python).is_file():
        raise ValueError(f"no such Python: {python} (make the pipecat venv with scripts/pipecat-venv.sh)")
    if missing := [name for name in files if not Path(name).is_file()]:
        raise ValueError(f"no such file: {', '.join(missing)}")
    output_dir = Path(fresh_dir(time.strftime("outputs/%Y-%m-%d/%H-%M-%S-pipecat")))
    clips = [Clip(Path(name).name, audio.read_audio(name, RATE)) for name in files] if files else default_clips()
    side = sides(composed(overrides, output_dir))
    load_before = " ".join(f"{value:.2f}" for value in os.getloadavg())
    rows: list[dict[str, Any]] = []
    llm = set_up(overrides, "llm", output_dir)
    agent, ready = None, {"versions": {}, "python": "?"}
    try:
        with ChatServer(llm) as server:
            agent = PipecatAgent(python, ["--whisper", side["whisper"], "--whisper-compute-type", side["compute_type"],
                                          "--voice", side["voice"], "--piper", json.dumps(side["piper"]),
                                          "--llm-url", server.url, "--system-prompt", side["system_prompt"],
                                          "--chunk-ms", str(side["chunk_ms"]), "--turn", turn],
                                 output_dir / "pipecat-agent.log")
            ready = agent.expect("READY", READY_TIMEOUT_S)
            print(f"pipecat side ready: {ready}")
            for round_ in range(1, rounds + 1):
                for index, clip in enumerate(clips):
                    run_dir = output_dir / f"r{round_}-{index:02d}"
                    run_dir.mkdir()
                    write_input(clip, run_dir / "input.wav")
                    end = LEAD_S + speech_end_s(clip.samples, RATE)
                    row: dict[str, Any] = {"round": round_, "file": clip.name, "speech_end_s": round(end, 4)}
                    order = ["ours", "pipecat"] if (round_ + index) % 2 == 0 else ["pipecat", "ours"]
                    for who in order:
                        if who == "ours":
                            metrics = run_pipeline(run_dir / "input.wav", run_dir, overrides, trailing_s)
                            row["ours"], row["ours_cutoffs"] = measured(our_onsets(metrics), end)
                            turns = metrics.get("turns") or []
                            row["ours_transcript"] = " / ".join(item["user"] for item in turns) or "-"
                            row["ours_reply"] = " / ".join(item["assistant"] for item in turns)
                            row["ours_own_metric"] = [item["timings"]["voice_to_voice_s"] for item in turns]
                            row["ours_turns"] = len(turns)
                        else:
                            length_s = LEAD_S + len(clip.samples) / RATE + trailing_s
                            server.last_messages = []
                            result = agent.run({"input": str(run_dir / "input.wav"), "speech_end_s": end,
                                                "trailing_s": trailing_s, "reply_timeout_s": reply_timeout_s},
                                               length_s + reply_timeout_s + 60)
                            if "error" in result:
                                raise RuntimeError(f"pipecat failed on {clip.name}: {result['error']}")
                            row["pipecat"], row["pipecat_cutoffs"] = measured(result["onsets_s"], end)
                            row["pipecat_transcript"] = result["transcript"] or "-"
                            row["pipecat_turns"] = result["turns"]
                            row["pipecat_reply"] = result["reply"]
                            server.wait_idle(10.0)  # its reply's generation ends before the next run starts
                            row["pipecat_llm_messages"] = server.last_messages
                    print(f"round {round_} {clip.name}: ours {_cell(row['ours'])} s, pipecat {_cell(row['pipecat'])} s"
                          f" (cut-offs {_cuts(row['ours_cutoffs'])} / {_cuts(row['pipecat_cutoffs'])})", flush=True)
                    rows.append(row)
    finally:
        if agent is not None:
            agent.close()
        llm.close()
    meta = {"machine": cpu_description(), "load_before": load_before,
            "load_after": " ".join(f"{value:.2f}" for value in os.getloadavg()),
            "pipecat": ", ".join(f"{name} {version}" for name, version in ready["versions"].items())
            + f", Python {ready['python']}, turn: {turn}",
            "turn": turn, "overrides": overrides, "rounds": rounds, "trailing_s": trailing_s, "models": side}
    text = report(rows, meta)
    (output_dir / "pipecat.md").write_text(text + "\n")
    (output_dir / "pipecat.json").write_text(json.dumps({"rows": rows, **meta}, indent=2))
    print("\n" + text)
    print(f"\npipecat.md, pipecat.json, pipecat-agent.log and each run's files in {output_dir.resolve()}")
    return 0

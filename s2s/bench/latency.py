"""python -m s2s.bench latency [FILES...] [key=value ...]: true voice-to-voice on the composed pipeline.

Each file is fed realtime-paced, as a microphone would, with trailing silence, as its own conversation: one run of
the real runner per file, each in a subfolder of the benchmark's run folder (so a long reply to one question never
delays the next, and no answer leans on an earlier one). True voice-to-voice is measured from the end of the
user's speech in the file itself (its energy, :func:`s2s.bench.server.speech_end_s`), endpointing included, to the
first reply audio at the sink; the pipeline's own figure counts from the VAD's last voiced frame, which came
about 0.1 s after the last word on real recordings. Without files it
speaks a set of questions with espeak-ng (several voices and rates, as the tests do) after the bundled sample,
and adds the recordings of real people that installed packages ship. It also prints when the models were ready
and how well Whisper hears the reply audio back (WER against the reply text). Peak memory is one pipeline's: the
variant's first run (with ``--versus``, the second variant's first run shares the process with the first's).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from s2s import audio
from s2s.bench.server import speech_end_s
from s2s.bench.speech import Clip, espeak, espeak_available, recordings
from s2s.platform import cpu_description

RATE = 16000
LEAD_S = 0.5  # silence written before each clip
# (text, espeak voice, words per minute): everyday questions, several voices and speeds
QUESTIONS = [
    ("What is the capital of France?", "en-us", 150),
    ("Can you tell me a fun fact about the ocean?", "en-gb", 165),
    ("How many days are there in a leap year?", "en-us+f3", 140),
    ("What should I cook for dinner tonight?", "en-us", 175),
    ("Why is the sky blue?", "en-gb+m3", 155),
]
TRUE = "true_voice_to_voice_s"  # from the file's own end of speech: the last turn of each clip
BREAKDOWN = [(TRUE, "true voice-to-voice"), ("voice_to_voice_s", "from the VAD's end"), ("endpoint_s", "endpoint"),
             ("stt_s", "STT"), ("stt_after_s", "STT after end of speech"),
             ("llm_first_sentence_s", "LLM 1st chunk"), ("tts_first_audio_s", "TTS 1st chunk"), ("held_s", "held"),
             # the turn detectors' calls, beside the chain (reported by the VAD and the LLM stage; alone on an idle
             # core Smart Turn takes about 0.04 s and the words' scoring 0.1 s, README: Two busy cores)
             ("smart_turn_s", "Smart Turn"), ("words_scoring_s", "words' scoring")]


def default_clips(folder: Path) -> list[Clip]:
    """The bundled sample, espeak-ng recordings of :data:`QUESTIONS` (written into ``folder``) and the real
    recordings that installed packages ship (:func:`s2s.bench.speech.recordings`)."""
    from s2s.resolvers import sample

    clips = [Clip("question.wav (bundled)", audio.read_audio(sample("question.wav"), RATE))]
    if espeak_available():
        clips += [espeak(text, voice, rate, folder / f"espeak_{index}.wav")
                  for index, (text, voice, rate) in enumerate(QUESTIONS)]
    else:
        print("espeak-ng is not installed: its questions are left out (apt-get install espeak-ng)")
    return clips + recordings()


def write_input(clip: Clip, path: Path) -> None:
    """Half a second of silence, then the clip (the source adds the trailing silence)."""
    import soundfile

    soundfile.write(path, np.concatenate([audio.silence(LEAD_S, RATE), clip.samples]), RATE)


def run_pipeline(stream: Path, output_dir: Path, overrides: list[str], trailing_s: float) -> dict[str, Any]:
    """The composed config (platform detected, command-line overrides applied) over ``stream``, realtime."""
    from s2s import job
    from s2s.bench.compose import composed

    cfg = composed([*overrides, f"source.path={stream}", "source.realtime=true",
                    f"source.trailing_silence_ms={int(trailing_s * 1000)}"], output_dir)
    code = job.run(cfg)
    if code:
        raise SystemExit(code)
    return json.loads((output_dir / "metrics.json").read_text())


def rows(clip: Clip, metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The clip's turns, one row each (a clip may hold several utterances; one that was not heard still shows)."""
    result = []
    turns = metrics["turns"] or [None]
    speech_end = LEAD_S + speech_end_s(clip.samples, RATE)
    for index, turn in enumerate(turns):
        timings = {**turn.get("reported", {}), **turn["timings"]} if turn else {}
        heard = timings.get("first_audio_at_s")
        if index == len(turns) - 1 and heard is not None:  # the file's end of speech is its last turn's
            timings[TRUE] = round(heard - speech_end, 4)
        result.append({"file": clip.name, "turn": turn["turn"] if turn else None,
                       "transcript": turn["user"] if turn else "(no turn)",
                       "first_chunk": turn.get("first_chunk", "") if turn else "",
                       **{key: timings.get(key) for key, _ in BREAKDOWN}})
    return result


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def table(found: list[dict[str, Any]], peak_mb: float | None) -> str:
    head = ["file", *[label for _, label in BREAKDOWN], "transcript", "first reply chunk"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in found:
        lines.append("| " + " | ".join([row["file"], *[_cell(row[key]) for key, _ in BREAKDOWN],
                                        row["transcript"], row["first_chunk"]]) + " |")
    for label, q in (("p50", 50), ("p90", 90)):
        cells = []
        for key, _ in BREAKDOWN:
            values = [row[key] for row in found if row[key] is not None]
            cells.append(_cell(float(np.percentile(values, q))) if values else "-")
        lines.append("| " + " | ".join([f"**{label}**", *cells, "", ""]) + " |")
    values = [row[TRUE] for row in found if row[TRUE] is not None]
    worst = f"{max(values):.2f} s" if values else "-"
    lines.append("")
    lines.append(f"{len(values)} turns; true voice-to-voice median {statistics.median(values):.2f} s, worst {worst}; "
                 f"peak memory {_cell(peak_mb)} MiB (the first run)" if values
                 else f"no turns; peak memory {_cell(peak_mb)} MiB")
    after = [_p50(found, "stt_after_s", q) for q in (50, 90)]
    if after[0] is not None:  # from the VAD letting the segment go to the transcript, a pass still running included
        lines.append(f"STT after end of speech: p50 {after[0]:.3f} s, p90 {after[1]:.3f} s")
    return "\n".join(lines)


def _p50(found: list[dict[str, Any]], key: str = TRUE, q: int = 50) -> float | None:
    values = [row[key] for row in found if row[key] is not None]
    return float(np.percentile(values, q)) if values else None


def heard_back(run_dirs: list[Path]) -> list[float]:
    """WER of each run's reply audio as Whisper hears it back against the reply's text (runs with a reply.wav).

    The listener is the packaged Whisper with its full 30 s window and beam 5, built after every run was timed.
    """
    from s2s.bench.roundtrip import word_error_rate
    from s2s.messages import SpeechSegment, Transcript
    from s2s.stt.faster_whisper import FasterWhisperSTT

    pairs = []
    for run_dir in run_dirs:
        lines = (run_dir / "transcript.jsonl").read_text(encoding="utf-8").splitlines() \
            if (run_dir / "transcript.jsonl").is_file() else []
        said = " ".join(json.loads(line)["assistant"] for line in lines).strip()
        if said and (run_dir / "reply.wav").is_file():
            pairs.append((said, audio.read_audio(run_dir / "reply.wav", RATE)))
    if not pairs:
        return []
    listener = FasterWhisperSTT(window_s=None)
    listener.setup()
    try:
        found = []
        for index, (said, samples) in enumerate(pairs):
            out = listener.process(SpeechSegment(samples, RATE, index, 0.0, len(samples) / RATE))
            heard = " ".join(m.text for m in out if isinstance(m, Transcript))
            found.append(word_error_rate(said, heard))
        return found
    finally:
        listener.close()


def _figures(metrics: list[dict[str, Any]], wers: list[float]) -> str:
    """Startup (the first run loads the models; later runs reuse the process's imports) and intelligibility."""
    setups = [sum(m.get("setup_s", {}).values()) for m in metrics]
    parts = [f"models ready in {setups[0]:.2f} s in the first run (later runs {statistics.median(setups[1:]):.2f} s)"
             if len(setups) > 1 else f"models ready in {setups[0]:.2f} s" if setups else "no startup figure"]
    if wers:
        parts.append(f"reply audio heard back by Whisper: median WER {statistics.median(wers):.3f}, worst "
                     f"{max(wers):.3f} ({len(wers)} replies)")
    return "; ".join(parts)


def bench_latency(files: list[str], overrides: list[str], trailing_s: float, versus: list[str] | None = None) -> int:
    """One run per clip; with ``versus``, each clip also runs with those overrides added, the two interleaved
    (in alternating order, so a machine that speeds up or slows down during the benchmark favours neither)."""
    from s2s.resolvers import fresh_dir

    output_dir = Path(fresh_dir(time.strftime("outputs/%Y-%m-%d/%H-%M-%S-latency")))
    if files:
        missing = [name for name in files if not Path(name).is_file()]
        if missing:
            raise ValueError(f"no such file: {', '.join(missing)}")
        clips = [Clip(Path(name).name, audio.read_audio(name, RATE)) for name in files]
    else:
        clips = default_clips(output_dir)
    other = " ".join(versus) if versus else None  # the second variant's name
    variants = {"": overrides, **({other: [*overrides, *versus]} if other else {})}
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    peaks: dict[str, list[float]] = {name: [] for name in variants}
    runs: dict[str, list[tuple[Path, dict[str, Any]]]] = {name: [] for name in variants}
    machine = None
    for index, clip in enumerate(clips):
        order = list(variants) if index % 2 == 0 else list(reversed(variants))
        for variant in order:
            run_dir = output_dir / (f"{index:02d}" + ("-vs" if variant else ""))
            run_dir.mkdir()
            write_input(clip, run_dir / "input.wav")
            metrics = run_pipeline(run_dir / "input.wav", run_dir, variants[variant], trailing_s)
            found[variant] += rows(clip, metrics)
            peaks[variant] += [metrics["peak_memory_mb"]] if metrics.get("peak_memory_mb") else []
            runs[variant].append((run_dir, metrics))
            machine = metrics.get("machine")
    # one pipeline's peak is its variant's first run: later runs rebuild the pipeline in the same process, whose
    # allocator keeps some of what earlier runs freed (it grew from 534 to 804 MiB over 9 runs, then held)
    peak = {name: values[0] if values else None for name, values in peaks.items()}
    wers = {name: heard_back([run_dir for run_dir, _ in runs[name]]) for name in variants}
    parts = []
    for variant in variants:
        title = f"with {variant}" if variant else (f"as composed{': ' + ' '.join(overrides) if overrides else ''}")
        parts.append((f"### {title}\n\n" if other else "") + table(found[variant], peak[variant]) + "\n"
                     + _figures([metrics for _, metrics in runs[variant]], wers[variant]))
    if other:
        base, with_other = _p50(found[""]), _p50(found[other])
        if base and with_other:
            parts.append(f"true voice-to-voice p50: {base:.2f} s as composed, {with_other:.2f} s with {other} "
                         f"(ratio {with_other / base:.2f}, same run, interleaved)")
        after = [_p50(found[name], "stt_after_s") for name in variants]
        if None not in after:
            parts.append(f"STT after end of speech p50: {after[0]:.3f} s as composed, {after[1]:.3f} s with {other}")
    parts.append(f"machine: {cpu_description()}")
    report = "\n\n".join(parts)
    (output_dir / "latency.md").write_text(report + "\n")
    (output_dir / "latency.json").write_text(json.dumps({"rows": found[""], "peak_memory_mb": peak[""],
                                                         "reply_wer": wers[""],
                                                         "machine": machine, "overrides": overrides,
                                                         **({"versus": versus, "versus_rows": found[other],
                                                             "versus_peak_memory_mb": peak[other],
                                                             "versus_reply_wer": wers[other]}
                                                            if other else {})}, indent=2))
    print(report)
    print(f"\nlatency.md, latency.json and the run's files in {output_dir.resolve()}")
    return 0

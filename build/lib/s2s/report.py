"""Sweep reports: one row per job (its overrides, median latencies, memory, status) as CSV, Markdown and a plot.

The sweep callback writes them when a multirun ends; rebuild them at any time (a sweep that was stopped, a
job that crashed its worker) from the job folders alone::

    python -m s2s.report multirun/2025-01-31/12-00-00

Each job folder is read as the runner left it: ``.hydra/overrides.yaml``, ``metrics.json`` and, when the
sweep callback ran there, ``sweep_job.json`` (process and thread facts, an exception Hydra caught).
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from s2s.metrics import FIGURES

# (key, column heading) of the figures the Markdown table and the plot show; the CSV has every median
MAIN_FIGURES = [("voice_to_voice_s", "voice-to-voice (s)"), ("stt_s", "STT (s)"),
                ("llm_first_token_s", "LLM first token (s)"), ("tts_first_audio_s", "TTS first audio (s)"),
                ("tts_rtf", "RTF"), ("peak_memory_mb", "peak memory (MiB)"), ("wer", "WER")]
LATENCIES = ["voice_to_voice_s", "stt_s", "llm_first_token_s", "tts_first_audio_s"]
OUTPUTS = ("summary.csv", "summary.md", "summary.png")


@dataclass
class JobRow:
    """What one job of a sweep produced."""

    job: str
    path: Path
    overrides: list[str]
    status: str
    error: str | None = None
    turns: int = 0
    figures: dict[str, float | None] = field(default_factory=dict)  # summary medians + peak_memory_mb
    setup_s: float | None = None
    peak_shared: bool = False  # the peak includes earlier jobs run by the same process
    label: str = ""

    @property
    def failed(self) -> bool:
        return self.status not in ("completed", "dry_run")


def _number(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (sys.maxsize, name)


def find_jobs(sweep_dir: Path) -> list[Path]:
    """Job folders under ``sweep_dir`` (or ``sweep_dir`` itself for a single run), in job order."""
    if (sweep_dir / ".hydra").is_dir():
        return [sweep_dir]
    found = [marker.parent.parent for marker in sweep_dir.rglob(".hydra/overrides.yaml")]
    return sorted(found, key=lambda path: _number(path.relative_to(sweep_dir).as_posix()))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_job(path: Path, sweep_dir: Path) -> JobRow:
    """One row from a job folder, whatever state the job ended in."""
    overrides = [str(o) for o in (yaml.safe_load((path / ".hydra" / "overrides.yaml").read_text()) or [])]
    name = "0" if path == sweep_dir else path.relative_to(sweep_dir).as_posix()
    metrics = _read_json(path / "metrics.json")
    facts = _read_json(path / "sweep_job.json") or {}
    if metrics is None:
        if facts.get("error"):
            return JobRow(name, path, overrides, "failed", facts["error"])
        if facts.get("dry_run"):  # validated and printed its graph; nothing was measured
            return JobRow(name, path, overrides, "dry_run")
        return JobRow(name, path, overrides, "no_metrics", "no metrics.json: the job did not finish (killed?)")
    status = metrics.get("status", "unknown")
    error = metrics.get("error") or facts.get("error")
    if status == "running":  # the recorder never got to finish: the process died mid-run
        status, error = "incomplete", error or "stopped mid-run: metrics.json was never finalised"
    summary = metrics.get("summary") or {}
    figures = dict(summary.get("median") or {})
    figures["peak_memory_mb"] = metrics.get("peak_memory_mb")
    setup = metrics.get("setup_s") or {}
    return JobRow(name, path, overrides, status, error, turns=summary.get("turns", 0), figures=figures,
                  setup_s=round(sum(setup.values()), 3) if setup else None,
                  peak_shared=bool(facts.get("jobs_before_in_process")) and not facts.get("peak_memory_reset"))


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key, value


def label_jobs(rows: list[JobRow]) -> list[str]:
    """Give each row a label made of the overrides that differ between jobs; return the common overrides."""
    values = [dict(_split(o) for o in row.overrides) for row in rows]
    keys = list(dict.fromkeys(key for job in values for key in job))
    varying = [key for key in keys if len({job.get(key) for job in values}) > 1]
    for row, job in zip(rows, values):
        shown = [f"{key}={job[key]}" if key in job else f"~{key}" for key in varying]
        row.label = " ".join(shown) or f"job {row.job}"
    return [f"{key}={values[0][key]}" for key in keys if key not in varying and key in values[0]]


def collect(sweep_dir: str | Path) -> tuple[list[JobRow], list[str]]:
    """All job rows of a sweep and the overrides they share."""
    sweep_dir = Path(sweep_dir)
    rows = [read_job(path, sweep_dir) for path in find_jobs(sweep_dir)]
    return rows, label_jobs(rows)


def _columns(rows: list[JobRow]) -> list[str]:
    present = {key for row in rows for key, value in row.figures.items() if value is not None}
    ordered = [*FIGURES, *sorted(present - set(FIGURES) - {"peak_memory_mb"}), "peak_memory_mb"]
    return [key for key in ordered if key in present or key in FIGURES]


def write_csv(rows: list[JobRow], path: Path) -> None:
    figures = _columns(rows)
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["job", "label", "overrides", "status", "turns", *figures, "setup_s", "error", "dir"])
        for row in rows:
            writer.writerow([row.job, row.label, " ".join(row.overrides), row.status, row.turns,
                             *("" if row.figures.get(key) is None else row.figures[key] for key in figures),
                             "" if row.setup_s is None else row.setup_s, row.error or "", str(row.path)])


def _cell(value: Any, key: str = "") -> str:
    if value is None:
        return "-"
    if key == "peak_memory_mb":
        return f"{value:.0f}"
    if isinstance(value, float):
        return f"{value:.3f}" if key in ("tts_rtf", "wer") else f"{value:.2f}"
    return str(value)


def _escape(text: str, limit: int = 160) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return text.replace("|", "\\|")


def markdown(rows: list[JobRow], common: list[str], title: str) -> str:
    """The summary table in Markdown: main figures (medians over turns) per job."""
    # a column nobody has (no STT in a TTS benchmark, no WER outside one) is left out; the CSV keeps them all
    shown = [(key, heading) for key, heading in MAIN_FIGURES if any(row.figures.get(key) is not None for row in rows)]
    with_error = any(row.error for row in rows)
    headings = ["job", "overrides", "status", *(heading for _, heading in shown)] + (["error"] if with_error else [])
    lines = [f"# Sweep summary: {title}", ""]
    if common:
        lines += ["All jobs: `" + " ".join(common) + "`", ""]
    lines += ["| " + " | ".join(headings) + " |", "|" + "|".join("---" for _ in headings) + "|"]
    for row in rows:
        cells = [row.job, f"`{row.label}`", row.status]
        for key, _ in shown:
            cell = _cell(row.figures.get(key), key)
            cells.append(cell + ("*" if key == "peak_memory_mb" and row.peak_shared and cell != "-" else ""))
        if with_error:
            cells.append(_escape(row.error) if row.error else "")
        lines.append("| " + " | ".join(cells) + " |")
    statuses = Counter(row.status for row in rows)
    lines += ["", f"{len(rows)} job(s): " + ", ".join(f"{count} {status}" for status, count in statuses.items())
              + ". Figures are medians over each job's turns; RTF = synthesis time / audio duration (below 1 is "
                "faster than real time)."]
    if any(row.peak_shared for row in rows):
        lines.append("\\* peak memory includes earlier jobs run in the same process (the peak could not be reset "
                     "here); use a launcher with one process per job for exact figures.")
    return "\n".join(lines) + "\n"


def plot(rows: list[JobRow], path: Path, title: str) -> None:
    """Horizontal bar charts, one panel per kind of figure, one bar group per job (labels: varying overrides)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def values(key: str) -> list[float]:
        return [float("nan") if row.figures.get(key) is None else float(row.figures[key]) for row in rows]

    def present(key: str) -> bool:
        return any(row.figures.get(key) is not None for row in rows)

    latencies = [key for key in LATENCIES if present(key)]
    panels = [("latency", "seconds (median per turn)")] if latencies else []
    panels += [(key, unit) for key, unit in (("tts_rtf", "real-time factor (below 1: faster than real time)"),
                                             ("peak_memory_mb", "peak memory (MiB)"),
                                             ("wer", "word error rate (round trip)")) if present(key)]
    panels = panels or [("none", "no figures (every job failed)")]
    height = 1.2 + max(1, len(rows)) * (0.25 * max(1, len(latencies)) + 0.25)
    figure = Figure(figsize=(4.2 * len(panels) + 2.5, height), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    positions = list(range(len(rows)))
    headings = dict(MAIN_FIGURES)
    for axis, (key, unit) in zip(axes, panels):
        if key == "latency":
            width = 0.8 / len(latencies)
            for index, name in enumerate(latencies):
                offsets = [p - 0.4 + width * (index + 0.5) for p in positions]
                bars = axis.barh(offsets, values(name), height=width, label=headings[name].replace(" (s)", ""))
                _annotate(axis, bars, values(name), "{:.2f}")
            figure.legend(loc="outside upper left", ncol=len(latencies), fontsize="small", frameon=False)
        elif key != "none":
            bars = axis.barh(positions, values(key), height=0.6, color="tab:gray")
            _annotate(axis, bars, values(key), "{:.0f}" if key == "peak_memory_mb" else "{:.2f}")
            if key == "tts_rtf":
                axis.axvline(1.0, color="tab:red", linestyle="--", linewidth=1)
        axis.set_xlabel(unit)
        axis.grid(axis="x", alpha=0.3)
        axis.set_xlim(left=0)
        if axis.get_xlim()[1] <= 0:  # every value is 0 (a perfect WER): keep a readable scale
            axis.set_xlim(0, 1)
    axes[0].set_yticks(positions, [row.label + (f"  [{row.status}]" if row.failed else "") for row in rows])
    axes[0].set_ylabel("job (overrides that vary)")
    axes[0].invert_yaxis()  # job 0 on top, as in the table
    for tick, row in zip(axes[0].get_yticklabels(), rows):
        if row.failed:
            tick.set_color("tab:red")
    figure.suptitle(title)
    figure.savefig(str(path), dpi=110)


def _annotate(axis: Any, bars: Any, numbers: list[float], form: str) -> None:
    axis.bar_label(bars, ["" if number != number else form.format(number) for number in numbers],
                   padding=2, fontsize="x-small")
    axis.margins(x=0.15)  # room for the labels at the end of the longest bar


def write_report(sweep_dir: str | Path) -> dict[str, Path]:
    """Write summary.csv, summary.md and summary.png into ``sweep_dir``; return their paths."""
    sweep_dir = Path(sweep_dir)
    rows, common = collect(sweep_dir)
    title = sweep_dir.resolve().name if sweep_dir.name in ("", ".") else sweep_dir.as_posix()
    paths = {name: sweep_dir / name for name in OUTPUTS}
    write_csv(rows, paths["summary.csv"])
    paths["summary.md"].write_text(markdown(rows, common, title), encoding="utf-8")
    plot(rows, paths["summary.png"], f"{title}: medians per job")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m s2s.report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="a multirun folder (or a single run folder)")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(f"error: {args.sweep_dir} is not a folder", file=sys.stderr)
        return 2
    if not find_jobs(args.sweep_dir):
        print(f"error: no job folders (with .hydra/overrides.yaml) under {args.sweep_dir}", file=sys.stderr)
        return 2
    paths = write_report(args.sweep_dir)
    print(paths["summary.md"].read_text(encoding="utf-8"))
    print("written: " + ", ".join(str(path) for path in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

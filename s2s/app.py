"""The application: receives a composed config, validates it, builds the graph, runs it, writes results.

It composes nothing itself (``run.py`` and Hydra do), so tests and other front ends can call ``main(cfg)``.
"""
from __future__ import annotations

import logging
import signal
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from s2s.config import StageSpec, validate
from s2s.config_errors import ConfigErrors
from s2s.graph import Graph, StageSetupError
from s2s.metrics import Recorder, format_figures

log = logging.getLogger("s2s")

EXIT_CONFIG = 2


def describe_graph(cfg: DictConfig, specs: list[StageSpec]) -> str:
    """The graph a run would build: one line per stage with its target and identifying values."""
    lines = [f"graph for platform={cfg.host.name} (device auto -> {cfg.host.accelerator}):"]
    width = max(len(spec.group) for spec in specs)
    for spec in specs:
        stage = spec.build()  # constructors are cheap by contract: no model, no heavy import
        details = {"device": spec.kwargs["device"]} if "device" in spec.kwargs else {}
        details.update(stage.describe())
        shown = "  ".join(f"{key}={value}" for key, value in details.items())
        lines.append(f"  {spec.group:<{width}}  {spec.target}  {shown}".rstrip())
    return "\n".join(lines)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the graph like Ctrl-C does (only possible from the main thread)."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(cfg: DictConfig) -> int:
    """Run one job; returns the exit code (0 ok, 1 stage failure, 2 bad config, 130 interrupted)."""
    try:
        specs = validate(cfg)
    except ConfigErrors as errors:
        for error in errors.errors:
            print(f"config error: {error}", file=sys.stderr)
        _write_status(cfg, "config_error", str(errors))
        return EXIT_CONFIG
    if cfg.get("server"):  # server=realtime: one graph per client session instead of one run over source/sink
        from s2s import server

        return server.main(cfg, specs)
    if cfg.dry_run:
        print(describe_graph(cfg, specs))
        return 0

    recorder = Recorder(cfg.output_dir, last_stage=specs[-1].group,
                        run_info={"stages": {spec.group: spec.target for spec in specs}})
    stages = []
    for spec in specs:
        log.info("building %s: %s", spec.group, spec.target)
        try:
            stages.append((spec.group, spec.build()))
        except Exception as error:  # constructors only store values; a failure here is a bug worth its traceback
            _fail(cfg, recorder, f"stage '{spec.group}' could not be built: {type(error).__name__}: {error}",
                  traceback.format_exc())
            return 1
    graph = Graph(stages, recorder, barge_in=cfg.runner.barge_in, half_duplex=cfg.runner.half_duplex,
                  stop_timeout_s=cfg.runner.stop_timeout_s)
    with sigterm_as_interrupt():
        try:
            recorder.setup_s = graph.setup(warm_up=cfg.runner.warm_up)
            result = graph.run()
        except KeyboardInterrupt:
            recorder.finish("interrupted", "interrupted during setup")
            print("interrupted", file=sys.stderr)
            return 130
        except StageSetupError as error:  # a stage that cannot start: one clear line, details in error.log
            _fail(cfg, recorder, str(error), traceback.format_exc())
            return 1
        finally:
            graph.close()
    if result.failure:
        _fail(cfg, recorder, str(result.failure), result.failure.traceback, status=result.status)
    else:
        recorder.finish(result.status)
    summary = recorder.summary()
    log.info("%s: %d turn(s); median %s", result.status, summary["turns"], format_figures(summary["median"]))
    log.info("reply audio, transcript.jsonl and metrics.json in %s", Path(cfg.output_dir).resolve())
    return result.exit_code


def _fail(cfg: DictConfig, recorder: Recorder, message: str, details: str, status: str = "failed") -> None:
    print(f"error: {message}", file=sys.stderr)
    (Path(cfg.output_dir) / "error.log").write_text(details)
    recorder.finish(status, message)


def _write_status(cfg: DictConfig, status: str, error: str) -> None:
    """A job that never started still leaves metrics.json saying why (sweep summaries read it)."""
    try:
        output_dir = Path(cfg.output_dir)
    except Exception:  # no output dir (e.g. composed without Hydra's runtime): nothing to write
        return
    Recorder(output_dir).finish(status, error)


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN

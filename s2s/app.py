"""The runner of one run: from checked stage specs, build the graph, run it over source and sink, write results.

It composes and checks nothing itself (the entry composes, :mod:`s2s.job` checks in one pass and calls
:func:`run_once`), and it does not know that a server exists: the job chooses between the two.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from s2s import tracing
from s2s.config import StageSpec, describe_graph
from s2s.config_errors import EXIT_CONFIG, ConfigError, ConfigErrors
from s2s.graph import Graph, Interrupted, StageSetupError
from s2s.metrics import Recorder, format_figures
from s2s.platform import release_memory
from s2s.stage import MissingExtraError, Stage
from s2s.torch_support import empty_caches

log = logging.getLogger("s2s")


@contextmanager
def _on_stop_signals(handler: Any) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``handler`` inside the block (only the main thread can; elsewhere nothing changes)."""
    try:
        previous = {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def signals_as_interrupt() -> Any:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread."""
    return _on_stop_signals(_raise_interrupted)


def no_interrupts() -> Any:
    """While results are written and stages closed, a second Ctrl-C must not cut the writing short."""
    return _on_stop_signals(signal.SIG_IGN)


def report_config_errors(cfg: DictConfig, errors: list[ConfigError]) -> None:
    """One line per problem on stderr, and the run folder's status says why nothing ran."""
    for error in errors:
        print(f"config error: {error}", file=sys.stderr)
    _write_status(cfg, "config_error", str(ConfigErrors(errors)))


def run_once(cfg: DictConfig, specs: list[StageSpec]) -> int:
    """One run over the configured source and sink (checked by :func:`s2s.job.problems`): print the graph
    (``dry_run``) or run it.

    Returns:
        The exit code: 0 ok, 1 a stage failed, 2 (``EXIT_CONFIG``) a run folder that holds another run, 130/143
        interrupted. After an interruption or a stage that would not stop, the process may end here without
        interpreter teardown.
    """
    if cfg.dry_run:
        print(describe_graph(cfg, specs))
        return 0
    if (Path(cfg.output_dir) / "metrics.json").exists():  # never overwrite another run's results
        print(f"config error: output_dir={cfg.output_dir}: invalid; expected a folder no other run has written "
              f"(it holds an earlier run's metrics.json)", file=sys.stderr)
        return EXIT_CONFIG
    return traced(cfg, lambda: _run(cfg, specs))


def traced(cfg: DictConfig, job: Callable[[], int]) -> int:
    """``job``'s exit code, with the process's tracing set up first (not for a dry run) and shut down after."""
    if not cfg.dry_run:
        try:
            tracing.start(cfg)
        except MissingExtraError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    try:
        return job()
    finally:
        tracing.shutdown()


def _run(cfg: DictConfig, specs: list[StageSpec]) -> int:
    """One run over the configured source and sink; the exit code."""
    recorder = Recorder(cfg.output_dir, last_stage=specs[-1].group, console=True,
                        run_info={"stages": {spec.group: spec.target for spec in specs}})
    tracing.follow(cfg, recorder, "run", specs, {"s2s.platform": str(cfg.platform.name),
                                                 "s2s.output_dir": str(Path(cfg.output_dir).resolve())})
    graph: Graph | None = None
    with signals_as_interrupt():
        try:
            graph = Graph(_build(specs), recorder, barge_in=cfg.runner.barge_in,
                          half_duplex=cfg.runner.half_duplex,
                          stop_timeout_s=cfg.runner.stop_timeout_s,
                          first_audio_wait_s=cfg.runner.first_audio_wait_s)
            recorder.setup_s = graph.setup(warm_up=cfg.runner.warm_up)
            if graph.live:
                print("listening: speak now, Ctrl-C to stop", flush=True)
            result = graph.run()
        except Interrupted as interrupt:
            with no_interrupts():
                recorder.finish("interrupted", "interrupted during setup")
                print("interrupted", file=sys.stderr)
                _close(graph)
                _exit_now(interrupt.exit_code)
        except StageSetupError as error:  # a stage that cannot start: one clear line, details in error.log
            with no_interrupts():
                _fail(cfg, recorder, str(error), traceback.format_exc())
                _close(graph)
            return 1
        except StageBuildError as error:  # constructors only store values; a failure here is a bug worth its traceback
            _fail(cfg, recorder, str(error), error.details)
            return 1
    with no_interrupts():
        _close(graph)
        if result.failure:
            _fail(cfg, recorder, str(result.failure), result.failure.traceback, status=result.status)
        else:
            recorder.finish(result.status)
        summary = recorder.summary()
        log.info("%s: %d turn(s); median %s", result.status, summary["turns"], format_figures(summary["median"]))
        log.info("reply audio, transcript.jsonl and metrics.json in %s", Path(cfg.output_dir).resolve())
        code = result.exit_code
        if result.status == "interrupted" or (result.stuck and not in_multirun()):
            # Everything is written and closed. A stage thread may still be inside a native call, and native
            # libraries (onnxruntime, CTranslate2) can abort in the interpreter's teardown after a signal
            # ("terminate called without an active exception", exit 134): leave without that teardown.
            if result.stuck:
                log.warning("leaving now: %s did not stop in time", ", ".join(result.stuck))
            _exit_now(code)
    return code


class StageBuildError(RuntimeError):
    def __init__(self, message: str, details: str) -> None:
        super().__init__(message)
        self.details = details


def _build(specs: list[StageSpec]) -> list[tuple[str, Stage]]:
    stages = []
    for spec in specs:
        log.info("building %s: %s", spec.group, spec.target)
        try:
            stages.append((spec.group, spec.build()))
        except Exception as error:
            raise StageBuildError(f"stage '{spec.group}' could not be built: {type(error).__name__}: {error}",
                                  traceback.format_exc()) from error
    return stages


def _close(graph: Graph | None) -> None:
    """Close every stage and give what it loaded back, so the next job in this process starts clean."""
    if graph is not None:
        graph.close()
        graph.stages.clear()
    empty_caches()
    release_memory()


def _exit_now(code: int) -> None:
    """End the process without interpreter teardown (results are already written and closed)."""
    tracing.shutdown()  # the last spans, bounded: nothing runs after os._exit
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


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

"""s2s inside a program: a pipeline or a realtime server from overrides, started and stopped, no Hydra main.

::

    from s2s.api import Agent, Server

    with Agent("llm.max_new_tokens=48", on_audio=play, on_turn=show) as agent:
        agent.feed(samples, 48000)     # any rate, mono or (frames, channels), float32 or int16, any thread
    # leaving the block ends the input, lets the last reply finish and closes every stage

    with Server("server.port=0") as server:
        print(server.url)              # ws://127.0.0.1:PORT/v1/realtime

The overrides are the command line's (``tts=kokoro_onnx``, ``profile=quality``); the platform is detected as
there, and a bad one raises :class:`ConfigProblems` with the same one-line messages, before any model loads.
An :class:`Agent` replaces the configured source and sink with the program: audio it feeds, reply audio to
``on_audio``; a turn's record (what was heard and said, its timings) goes to ``on_turn`` once final. Its run
folder (``transcript.jsonl``, ``metrics.json``) is ``output_dir``, a fresh temporary folder unless given.
"""
from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from s2s import audio
from s2s.config import StageSpec
from s2s.graph import Graph, RunResult
from s2s.io.push import CallbackSink, PushSource
from s2s.messages import ReplyAudio
from s2s.metrics import Recorder, Turn

STOP_TIMEOUT_S = 60.0  # how long stop() waits for the last reply to finish


class ConfigProblems(ValueError):
    """The overrides cannot run: one line per problem, as the command line prints them."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def _checked(overrides: list[str], output_dir: Path) -> tuple[Any, list[StageSpec]]:
    """The composed config of ``overrides`` (platform detected) and its stages, or :class:`ConfigProblems`.

    The target allowlist is checked on the whole composed config, ``hydra`` node included, as the command line's
    guard does; the guard itself is not installed, since a program's own Hydra use is its business (nothing here
    runs Hydra's callbacks or launchers: only the checked stages are built)."""
    from s2s import job, preflight
    from s2s.allowlist import target_errors
    from s2s.compose import compose, prepare_argv
    from s2s.platform import fix_allocator

    fix_allocator()
    argv = prepare_argv(overrides)
    if problems := preflight.check(argv):
        raise ConfigProblems(problems)
    if unsafe := target_errors(compose(argv)):
        raise ConfigProblems([str(error) for error in unsafe])
    cfg = compose(argv, output_dir, hydra_node=False)
    specs, errors = job.problems(cfg)
    if errors:
        raise ConfigProblems([str(error) for error in errors])
    return cfg, specs


class _TurnCallback:
    """A Recorder listener that hands each final turn record to the program."""

    def __init__(self, on_turn: Callable[[dict[str, Any]], None]) -> None:
        self.on_turn = on_turn

    def turn_finished(self, turn: Turn, record: dict[str, Any]) -> None:
        self.on_turn(record)

    def recording_finished(self, status: str, error: str | None) -> None:
        pass


class Agent:
    """One conversation with the composed pipeline: audio in from the program, replies out to it.

    Args:
        overrides: config overrides, as on the command line.
        on_audio: called with each block of reply audio (:class:`~s2s.messages.ReplyAudio`: ``samples``
            float32 mono, ``sample_rate``, ``turn``), in the pipeline's sink thread.
        on_turn: called with each turn's record once final (``user``, ``assistant``, timings).
        output_dir: the run folder (default: a fresh temporary folder).

    Raises:
        ConfigProblems: the overrides cannot run (nothing was loaded).
    """

    def __init__(self, *overrides: str, on_audio: Callable[[ReplyAudio], None] | None = None,
                 on_turn: Callable[[dict[str, Any]], None] | None = None,
                 output_dir: str | Path | None = None) -> None:
        self.output_dir = Path(output_dir) if output_dir is not None else Path(tempfile.mkdtemp(prefix="s2s-"))
        self.cfg, self.specs = _checked(list(overrides), self.output_dir)
        self.on_audio, self.on_turn = on_audio, on_turn
        self.sample_rate = int(self.cfg.audio.sample_rate)
        self.result: RunResult | None = None
        self._source = PushSource(self.sample_rate)
        self._resampler: audio.StreamResampler | None = None
        self._graph: Graph | None = None
        self._recorder: Recorder | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Agent:
        """Load every stage (a stage that cannot start raises ``StageSetupError``), then listen."""
        if self._graph is not None:
            raise RuntimeError("this Agent has started already; make a new one for a new conversation")
        specs, runner = self.specs, self.cfg.runner
        self._recorder = Recorder(self.output_dir, last_stage=specs[-1].group,
                                  run_info={"stages": {spec.group: spec.target for spec in specs}})
        if self.on_turn is not None:
            self._recorder.listen(_TurnCallback(self.on_turn))
        stages = [(specs[0].group, self._source), *((spec.group, spec.build()) for spec in specs[1:-1]),
                  (specs[-1].group, CallbackSink(self.on_audio))]
        self._graph = Graph(stages, self._recorder, barge_in=runner.barge_in, half_duplex=runner.half_duplex,
                            stop_timeout_s=runner.stop_timeout_s, first_audio_wait_s=runner.first_audio_wait_s)
        try:
            self._recorder.setup_s = self._graph.setup(warm_up=runner.warm_up)
        except BaseException:
            self._graph.close()
            self._recorder.finish("failed", "a stage could not start")
            raise
        self._thread = threading.Thread(target=self._run, name="s2s-agent", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        assert self._graph is not None
        self.result = self._graph.run()

    def feed(self, samples: np.ndarray, sample_rate: int) -> None:
        """Audio of the user, as it comes: float32 in [-1, 1] or int16, mono or ``(frames, channels)``."""
        if self._graph is None:
            raise RuntimeError("start() the Agent (or enter its with-block) before feeding it")
        samples = np.asarray(samples)
        floats = audio.int16_to_float(samples) if samples.dtype == np.int16 else samples.astype(np.float32)
        floats = audio.to_mono(floats)
        if self._resampler is None or self._resampler.rate_in != sample_rate:
            self._resampler = audio.StreamResampler(sample_rate, self.sample_rate)
        self._source.feed(self._resampler.feed(floats))

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict[str, Any]:
        """End the input, let the last reply finish (at most ``timeout_s``), close every stage; the summary
        (turns, median figures) that ``metrics.json`` also holds."""
        if self._graph is None or self._recorder is None or self._thread is None:
            raise RuntimeError("the Agent was not started")
        if self._resampler is not None:
            self._source.feed(self._resampler.flush())
            self._resampler = None
        self._source.end()
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # a reply still going: stop the graph now
            self._graph.stop()
            self._thread.join(float(self.cfg.runner.stop_timeout_s) + 1)
        self._graph.close()
        result = self.result
        if result is not None and result.failure is not None:
            self._recorder.finish(result.status, str(result.failure))
        else:
            self._recorder.finish(result.status if result is not None else "interrupted")
        return self._recorder.summary()

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Server:
    """The realtime server of the composed config (``server=realtime`` is added), in a thread of the program.

    Args:
        overrides: config overrides, as with ``s2s serve`` (``server.port=0`` picks a free port).
        output_dir: the server's run folder, where each session's files go (default: a fresh temporary folder).
        ready_timeout_s: how long :meth:`start` waits for the pipelines to load and the port to open.

    Raises:
        ConfigProblems: the overrides cannot serve (nothing was loaded).
    """

    def __init__(self, *overrides: str, output_dir: str | Path | None = None, ready_timeout_s: float = 300) -> None:
        self.output_dir = Path(output_dir) if output_dir is not None else Path(tempfile.mkdtemp(prefix="s2s-"))
        given = any(override.lstrip("+~").startswith("server=") for override in overrides)
        self.cfg, self.specs = _checked([*overrides, *([] if given else ["server=realtime"])], self.output_dir)
        self.ready_timeout_s = ready_timeout_s
        self.port: int | None = None
        self.exit_code: int | None = None
        self._stop, self._ready = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where clients connect: ``ws://host:port/v1/realtime``."""
        from s2s.server.handshake import PATH

        return f"ws://{self.cfg.server.host}:{self.port}{PATH}"

    def start(self) -> Server:
        """Load the pipelines and listen; returns once clients can connect (else RuntimeError)."""
        from s2s.server.launch import checked
        from s2s.server.server import serve_local

        settings, _ = checked(self.cfg, self.specs)
        if settings is None or settings.engine != "local":
            raise ConfigProblems(["server.engine=ray: start it with `s2s serve`; the API serves in this process"])

        def listening(port: int) -> None:
            self.port = port
            self._ready.set()

        def serve() -> None:
            self.exit_code = serve_local(self.cfg, self.specs, settings, self._stop, listening)
            self._ready.set()

        self._thread = threading.Thread(target=serve, name="s2s-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.ready_timeout_s) or self.port is None:
            self.stop()
            raise RuntimeError(f"the server did not start (exit code {self.exit_code}); see the log")
        return self

    def stop(self, timeout_s: float = 30) -> int | None:
        """Close every session and the port; returns the server's exit code (0: stopped)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self.exit_code

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

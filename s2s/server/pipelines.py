"""The pool of pipelines: the model stages of the composed config, set up once and lent to one session at a time.

A session's graph is ``socket source -> its own VAD -> <the pooled stages> -> socket sink``. The pooled stages
(STT, LLM, TTS, ...) are set up at start. A session borrows one with its own conversation (:meth:`Pipeline.lend`
hands the session's :class:`~s2s.chat_context.ChatContext` to the LLM stage) and returns it reset (the context
dropped, a TTS voice or speed changed in place set back). Each pipeline has its own stage objects (tokenizer,
voice, the context lent to it); the weights are loaded once per process where the backend allows it
(``s2s.sharing``: faster-whisper, transformers, Kokoro ONNX), so ``max_sessions`` pipelines cost little more
memory than one. Other backends load one copy per pipeline.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from s2s import sharing, turn_order
from s2s.chat_context import ChatContext
from s2s.config import StageSpec, validation_context
from s2s.schema import override_errors as stage_override_errors
from s2s.config_errors import ConfigError, ValidationContext
from s2s.graph import set_up
from s2s.llm.base import LLMStage
from s2s.platform import model_slots, threads_per_pipeline
from s2s.server.roles import find_roles
from s2s.stage import Stage
from s2s.tts.base import TTSStage

log = logging.getLogger("s2s.server")


def override_errors(cfg: Any, spec: StageSpec, overrides: dict[str, Any]) -> list[ConfigError]:
    """What the stage's own validation says about ``spec`` with ``overrides`` (the client's session.update)."""
    return stage_override_errors(spec.cls, spec.kwargs, overrides, validation_context(cfg, spec.group))


def share_cores(specs: list[StageSpec], pipelines: int, cores: int | None = None) -> list[StageSpec]:
    """``specs`` for ``pipelines`` that run at once on ``cores`` (None: this process's; a Ray replica: the CPUs Ray
    reserved for it): the weights are shared with a worker per pipeline (``s2s.sharing``), each stage library gets
    its share of the cores (``runner.threads``, where set, wins), and when the pipelines' threads are more than the
    cores their model calls take turns (``s2s.turn_order``). :func:`unshare` undoes it."""
    sharing.enable(users=pipelines)
    share = threads_per_pipeline(pipelines, cores)
    specs = [dataclasses.replace(spec, threads=spec.threads or share) for spec in specs]
    turn_order.configure(model_slots(pipelines, max((spec.threads or 0) for spec in specs) or None, cores))
    return specs


def unshare() -> None:
    """The shared weights go with the pipelines, and so does the order (a program's server may be one of many)."""
    sharing.enable(False)
    turn_order.configure(None)


@dataclass
class Pipeline:
    """The pooled stages of one session, in pipeline order (everything between the VAD and the sink)."""

    index: int
    stages: list[tuple[str, Stage]]
    defaults: dict[str, Any] = field(default_factory=dict)  # per-session settings to restore on release
    llm_group: str = "llm"  # the group of the stage that takes transcripts (Roles.llm)

    @property
    def llm(self) -> Stage:
        return dict(self.stages)[self.llm_group]

    def lend(self, log_content: bool) -> ChatContext:
        """A new conversation for the session that borrows this pipeline, lent to its LLM stage.

        ``log_content``: whether the words may reach the log (``server.log_transcripts``). :meth:`release`
        takes it back (the stage's ``reset`` starts another), so nothing of it reaches the next session.
        """
        context = ChatContext(log_content=log_content)
        if isinstance(self.llm, LLMStage):  # another LLM keeps no conversation: the edits go nowhere
            self.llm.context = context
        return context

    def change_in_place(self, group: str, changes: dict[str, Any], context: ValidationContext) -> bool:
        """Apply a session's TTS ``changes`` to the pooled stage, model kept (False: it cannot; nothing changed).

        :meth:`release` restores the configured values.
        """
        stage = dict(self.stages).get(group)
        return isinstance(stage, TTSStage) and stage.apply_settings(changes, context)

    def release(self) -> None:
        """Forget the session: its conversation, buffers, TTS settings changed in place."""
        configured = self.defaults.get("tts_settings", {})
        for name, stage in self.stages:
            try:
                if name in configured and stage.settings() != configured[name]:  # type: ignore[attr-defined]
                    stage.restore_settings(configured[name])  # type: ignore[attr-defined]
                stage.reset()
            except Exception as error:  # a reset failing must not keep the pipeline from the pool
                log.warning("resetting %s failed: %s: %s", name, type(error).__name__, error)


class Pool:
    """``size`` pipelines built from the same specs; ``acquire`` lends one or returns None when all are out."""

    def __init__(self, specs: list[StageSpec], size: int) -> None:
        self.specs = specs
        self.roles = find_roles(specs)
        self.pooled = self.roles.pooled  # source, VAD and sink belong to each session
        self.size = size
        self.pipelines: list[Pipeline] = []
        self._free: list[Pipeline] = []
        self._lock = threading.Lock()

    def setup(self, warm_up: bool) -> dict[str, float]:
        timings: dict[str, float] = {}
        for index in range(self.size):
            stages = []
            for spec in self.pooled:
                stage = spec.build()
                timings[f"{index}.{spec.group}"] = set_up(spec.group, stage, warm_up)
                stages.append((spec.group, stage))
            llm = dict(stages)[self.roles.llm.group]
            defaults: dict[str, Any] = {"system_prompt": llm.system_prompt} if isinstance(llm, LLMStage) else {}
            defaults["tts_settings"] = {name: stage.settings() for name, stage in stages
                                        if isinstance(stage, TTSStage) and stage.runtime_keys}
            pipeline = Pipeline(index, stages, defaults, self.roles.llm.group)
            self.pipelines.append(pipeline)
            self._free.append(pipeline)
            log.info("pipeline %d/%d ready (%s)", index + 1, self.size,
                     ", ".join(f"{name} {timings[f'{index}.{name}']:.1f} s" for name, _ in stages))
        return timings

    def acquire(self) -> Pipeline | None:
        with self._lock:
            return self._free.pop(0) if self._free else None

    def give_back(self, pipeline: Pipeline) -> None:
        pipeline.release()
        with self._lock:
            self._free.append(pipeline)

    @property
    def in_use(self) -> int:
        with self._lock:
            return self.size - len(self._free)

    def close(self) -> None:
        for pipeline in self.pipelines:
            for name, stage in pipeline.stages:
                try:
                    stage.close()
                except Exception as error:
                    log.warning("closing %s failed: %s: %s", name, type(error).__name__, error)

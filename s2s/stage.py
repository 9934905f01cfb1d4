"""The stage contract.

A stage is built from plain config values (cheap: no model load, no heavy import), then the runner calls
``setup()`` once (load the model here, importing the backend library here), ``warm_up()``,
``process(message)`` per input message, ``end_turn(turn)`` when a turn is complete, ``discard(turn)`` when a
speculative turn is dropped, ``flush()`` at end of input, ``reset()`` between conversations and ``close()`` at the end.
A stage never sees a queue, a thread or a stop flag: it only yields messages. When the runner stops consuming
a ``process`` generator (interruption, shutdown), it closes it, so ``finally`` blocks in a backend run.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any, ClassVar

from s2s.config_errors import ValidationContext
from s2s.messages import Control, Data, Message
from s2s.runtimes import ByBackend, Runtime


class MissingExtraError(RuntimeError):
    """A backend library is not installed; the message names the pip extra that brings it."""

    def __init__(self, backend: str, module: str, extra: str | None, cause: BaseException | None = None,
                 install: str | None = None) -> None:
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        if install is None:  # no extra: the package belongs to the base install, which is broken
            install = f"pip install -e '.[{extra}]'" if extra else "scripts/setup.sh (the base install)"
        super().__init__(f"{backend} needs the Python package providing '{module}', which is missing{detail}. "
                         f"Install it with: {install}")
        self.extra = extra


def require(module: str, *, backend: str, extra: str | None) -> Any:
    """Import ``module`` for ``backend`` or raise :class:`MissingExtraError` naming the pip extra.

    ``extra=None`` marks a package of the base install (the error then points at scripts/setup.sh).
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(backend, module, extra, error) from error


class Stage:
    """Base class of every pipeline stage.

    Subclasses set ``accepts`` and ``emits`` to the data message types they consume and produce, so a pipeline
    whose neighbours do not fit is refused before anything loads; ``requires`` names a runtime some platforms
    lack, and ``validate_config`` may add cross-field rules, both checked before anything loads.
    """

    # CPU threads the runner gives this stage's library (``runner.threads.<group>``); None: the library decides
    threads: int | None = None
    accepts: ClassVar[tuple[type[Data], ...]] = ()  # data types ``process`` consumes
    emits: ClassVar[tuple[type[Data], ...]] = ()  # data types it yields; checked against the next stage's accepts
    # the runtime library it needs where some platforms have none (mlx, ...), one per backend value or one for all;
    # the validator checks it against platform.unavailable, so a stage never looks at the platform
    requires: ClassVar[Runtime | ByBackend | None] = None
    # its calls compute on this process's cores (False: a remote API, which waits on the network): a server with
    # more pipelines than cores runs such calls in turn (s2s.turn_order)
    on_cores: ClassVar[bool] = True
    # control messages a later stage emits that the runner hands back to this one (``steer``), e.g. TurnVerdict
    takes: tuple[type[Control], ...] = ()  # a class or an instance attribute (the VAD's depends on its turn group)
    # progress on an open turn this stage would like from the one before it (an STT: the speech so far)
    asks: tuple[type[Data], ...] = ()
    # set by the runner: the feedback some stage of this graph takes, and the progress the next stage asks for;
    # a stage makes such messages only when they are wanted
    wanted: frozenset[type[Message]] = frozenset()
    # set by the runner: the user's speech cancels the reply in progress (runner.barge_in, a realtime session's
    # interrupt_response); only then may a VAD resume a turn the speaker goes on from (vad.resume_ms)
    barge_in: bool = False

    def setup(self) -> None:
        """Load models and open devices. Called once, before the first message."""

    def warm_up(self) -> None:
        """One throwaway inference after ``setup``, so the first turn does not pay one-off costs.

        Allocations, kernel planning and lazy initialisation otherwise land on the first reply's latency.
        The runner calls it when ``runner.warm_up`` is true (the default).
        """

    def process(self, message: Data) -> Iterator[Message]:
        """Consume one message and yield zero or more output messages, as soon as each is ready."""
        raise NotImplementedError
        yield  # pragma: no cover

    def end_turn(self, turn: int) -> Iterator[Message]:
        """Everything of ``turn`` has been processed (a ``TurnEnd`` arrived); yield what completes it."""
        return iter(())

    def flush(self) -> Iterator[Message]:
        """End of input: yield whatever is still buffered (e.g. an open speech segment)."""
        return iter(())

    def discard(self, turn: int) -> None:
        """Forget what ``turn`` left in per-conversation state: a speculative attempt the user spoke over.

        The runner calls it in the stage's own thread when the ``TurnDiscarded`` reaches the stage, so it
        comes after everything the stage did for that turn.
        """

    def steer(self, message: Control) -> Iterator[Message]:
        """A feedback message of a type in ``takes`` came back from a later stage; yield what it causes.

        The runner calls it in the stage's own thread, between two ``process`` calls.
        """
        return iter(())

    def reset(self) -> None:
        """Forget per-conversation state (history, buffers)."""

    def close(self) -> None:
        """Release models, files and devices. Safe to call more than once and after a failed setup."""

    def describe(self) -> dict[str, Any]:
        """What a dry run shows about this stage: model, device and other identifying values."""
        return {}

    @classmethod
    def validate_config(cls, kwargs: dict[str, Any], context: ValidationContext) -> None:
        """Cross-field rules on the constructor's keyword arguments; raise ``ConfigError`` for each problem.

        Runs before anything is built. ``context`` tells the platform the run targets.
        """


class Source(Stage):
    """A stage with no input: ``stream()`` yields messages until the input ends.

    ``live`` sources (a microphone) keep producing while the assistant speaks; the runner can then ignore
    them until the reply ends (half duplex), so the assistant does not answer its own voice.
    """

    live: ClassVar[bool] = False

    def stream(self) -> Iterator[Message]:
        raise NotImplementedError
        yield  # pragma: no cover

    def process(self, message: Data) -> Iterator[Message]:
        raise TypeError(f"{type(self).__name__} is a source and consumes no messages")


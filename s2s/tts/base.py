"""Shared behaviour of TTS stages: one streaming hook, output converted to the pipeline format once."""
from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from s2s import audio
from s2s.config_errors import ConfigErrors, ValidationContext
from s2s.messages import Data, Message, Metric, ReplyAudio, ReplyText
from s2s.schema import override_errors
from s2s.stage import Stage

log = logging.getLogger(__name__)


class SynthesisFailed(RuntimeError):
    """The backend could not say this chunk (a server answered an error, dropped or stalled the stream).

    The rest of the chunk is dropped with the error logged and recorded (a ``tts_error`` event of the turn); the
    reply goes on with its next chunk.
    """


class TTSStage(Stage):
    """Base of TTS backends: implement ``synthesize(text, language)`` yielding audio blocks as they are made.

    Blocks may be numpy arrays, torch tensors or mx arrays of any shape and dtype at ``self.sample_rate``;
    ``process`` turns each into a :class:`ReplyAudio` in the pipeline format. When the runner stops reading
    (barge-in, shutdown) the generator is closed, so a backend stops its library's stream in ``finally``.

    The silence a model pads each chunk with is shortened (:class:`s2s.audio.PauseShaper`): the reply's sound
    starts at most ``lead_silence_s`` into its first block, and chunks end at most ``max_pause_s`` after their
    last sound, so sentences follow each other at a talking pace. Pauses inside a chunk are kept.

    ``voice_key`` and ``speed_key`` name the constructor keywords that choose a named voice and the speaking
    rate (1.0 = normal), or None where the backend has none: the realtime server maps a client's
    ``audio.output.voice`` and ``audio.output.speed`` onto them, and on nothing else.

    ``runtime_keys`` are the constructor keywords a set-up stage can change in place, model kept
    (:meth:`apply_settings`); a change of any other key needs a new stage. A reply chunk that names its own
    ``voice`` is said in it when the voice key is one of them (the owner judged the voice beforehand).

    ``blocksize`` (samples; None: as the library makes them) regroups a backend's blocks into blocks of that
    size before they are shaped (:func:`s2s.audio.reblock`).

    A backend raises :class:`SynthesisFailed` to drop one chunk instead of stopping the run.
    """

    accepts = (ReplyText,)
    emits = (ReplyAudio,)
    sample_rate: int = 24000
    lead_silence_s: float = 0.01
    max_pause_s: float = 0.25
    voice_key: ClassVar[str | None] = None
    speed_key: ClassVar[str | None] = None
    runtime_keys: ClassVar[frozenset[str]] = frozenset()
    blocksize: int | None = None

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        raise NotImplementedError
        yield  # pragma: no cover

    def settings(self) -> dict[str, Any]:
        """The current values of ``runtime_keys`` (what :meth:`apply_settings` takes to restore them)."""
        return {key: getattr(self, key) for key in self.runtime_keys}

    def apply_settings(self, changes: Mapping[str, Any], context: ValidationContext) -> bool:
        """Change constructor keywords of the set-up stage in place, without reloading its model.

        The new values are judged first by the rules a config is judged by (:func:`s2s.schema.override_errors`:
        the constructor's annotations and ``validate_config``), as the server judges a ``session.update``.

        Args:
            changes: key -> new value.
            context: the group and platform to judge them for (the caller's: a stage knows no platform).

        Returns:
            False, having changed nothing, when a key is not one of ``runtime_keys`` (build a new stage).

        Raises:
            ConfigErrors: a value those rules refuse (nothing is changed).
        """
        if not set(changes) <= self.runtime_keys:
            return False
        if errors := override_errors(type(self), self.constructed(), dict(changes), context):
            raise ConfigErrors(errors)
        for key, value in changes.items():
            setattr(self, key, value)
        self.settings_changed(set(changes))
        return True

    def restore_settings(self, values: Mapping[str, Any]) -> None:
        """Set back values :meth:`settings` returned earlier (already judged when the stage was configured)."""
        if changed := {key for key, value in values.items() if getattr(self, key) != value}:
            for key in changed:
                setattr(self, key, values[key])
            self.settings_changed(changed)

    def constructed(self) -> dict[str, Any]:
        """The constructor keywords this stage holds as attributes of the same name."""
        names = inspect.signature(type(self)).parameters
        return {name: getattr(self, name) for name in names if hasattr(self, name)}

    def settings_changed(self, keys: set[str]) -> None:
        """Bring what the stage derived from ``keys`` at setup up to date (their attributes are already set)."""

    def warm_up(self) -> None:
        for _ in self.synthesize("Hello there.", None):
            pass

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, ReplyText)
        if not message.spoken:  # a text-only reply: nothing to say aloud
            return
        key = self.voice_key
        if message.voice is None or key is None or key not in self.runtime_keys or message.voice == getattr(self, key):
            yield from self._speak(message)
            return
        own = self.settings()  # a voice for this reply alone (a realtime client's response), already judged
        self.restore_settings({key: message.voice})
        try:
            yield from self._speak(message)
        finally:
            self.restore_settings(own)

    def _speak(self, message: ReplyText) -> Iterator[Message]:
        blocks = self.synthesize(message.text, message.language)
        shaper = audio.PauseShaper(self.sample_rate, self.lead_silence_s, self.max_pause_s)
        converted = (audio.to_pipeline(block, self.sample_rate) for block in blocks)
        if self.blocksize:
            converted = audio.reblock(converted, self.blocksize)
        try:
            for block in converted:
                samples = shaper.feed(block)
                if len(samples):
                    yield ReplyAudio(samples, self.sample_rate, message.turn)
        except SynthesisFailed as error:
            log.error("turn %d: a reply chunk was not said: %s", message.turn, error)
            yield Metric(message.turn, "tts_error", 1.0, {"event": "tts_error", "error": str(error)})
        finally:
            blocks.close()  # type: ignore[attr-defined]
        if len(tail := shaper.finish()):
            yield ReplyAudio(tail, self.sample_rate, message.turn)

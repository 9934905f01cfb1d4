"""Shared behaviour of TTS stages: one streaming hook, output converted to the pipeline format once."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from s2s import audio
from s2s.messages import Data, Message, ReplyAudio, ReplyText
from s2s.stage import Stage


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
    """

    accepts = (ReplyText,)
    emits = (ReplyAudio,)
    sample_rate: int = 24000
    lead_silence_s: float = 0.05
    max_pause_s: float = 0.25
    voice_key: ClassVar[str | None] = None
    speed_key: ClassVar[str | None] = None

    def synthesize(self, text: str, language: str | None) -> Iterator[Any]:
        raise NotImplementedError
        yield  # pragma: no cover

    def warm_up(self) -> None:
        for _ in self.synthesize("Hello there.", None):
            pass

    def process(self, message: Data) -> Iterator[Message]:
        assert isinstance(message, ReplyText)
        blocks = self.synthesize(message.text, message.language)
        shaper = audio.PauseShaper(self.sample_rate, self.lead_silence_s, self.max_pause_s)
        try:
            for block in blocks:
                samples = shaper.feed(audio.to_pipeline(block, self.sample_rate))
                if len(samples):
                    yield ReplyAudio(samples, self.sample_rate, message.turn)
        finally:
            blocks.close()  # type: ignore[attr-defined]
        if len(tail := shaper.finish()):
            yield ReplyAudio(tail, self.sample_rate, message.turn)

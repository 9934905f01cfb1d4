"""The server finds its stages by the messages they take and make, as the graph does: never by position or name."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from s2s.config import StageSpec
from s2s.io.file import FileSink, FileSource
from s2s.llm.echo import EchoLM
from s2s.messages import Data, Message, Transcript
from s2s.server.roles import find_roles, shape_errors
from s2s.stage import Stage
from s2s.stt.faster_whisper import FasterWhisperSTT
from s2s.tts.piper import PiperTTS
from s2s.vad.silero import SileroVAD


class Spellcheck(Stage):
    """A stage of a user's own between the STT and the LLM: transcripts in, transcripts out."""

    accepts = (Transcript,)
    emits = (Transcript,)

    def process(self, message: Data) -> Iterator[Message]:
        yield message


def spec(group: str, cls: type) -> StageSpec:
    return StageSpec(group, f"{cls.__module__}.{cls.__name__}", cls, {})


def test_roles_come_from_message_types_whatever_the_groups_are_called_and_wherever_they_stand():
    specs = [spec("source", FileSource), spec("vad", SileroVAD), spec("stt", FasterWhisperSTT),
             spec("fix", Spellcheck), spec("chat", EchoLM), spec("tts", PiperTTS), spec("sink", FileSink)]
    roles = find_roles(specs)
    assert (roles.source.group, roles.vad.group, roles.sink.group) == ("source", "vad", "sink")
    assert roles.stt.group == "stt" and roles.tts.group == "tts"
    assert roles.llm.group == "fix"  # the first stage that takes a transcript gets the typed turns
    assert [s.group for s in roles.pooled] == ["stt", "fix", "chat", "tts"]


@pytest.mark.parametrize("pipeline, expected", [
    (["source", "vad", "sink"], "source, a VAD"),
    (["source", "stt", "llm", "tts", "sink"], "a VAD that accepts AudioChunk"),
    (["source", "vad", "stt", "tts", "sink"], "accepts Transcript"),
    (["source", "vad", "stt", "llm", "sink"], "emits ReplyAudio"),
])
def test_a_pipeline_that_cannot_serve_says_what_it_lacks(pipeline, expected):
    classes = {"source": FileSource, "vad": SileroVAD, "stt": FasterWhisperSTT, "llm": EchoLM, "tts": PiperTTS,
               "sink": FileSink}
    specs = [spec(group, classes[group]) for group in pipeline]
    problems = shape_errors(specs)
    assert problems and expected in str(problems[0]) and "pipeline=[" in str(problems[0])
    with pytest.raises(ValueError, match="pipeline="):
        find_roles(specs)

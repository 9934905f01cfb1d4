"""Which configured stage does what in a session, found once from the messages each takes and makes.

The graph routes by message type; the server finds its stages the same way, never by position or group name, so
a pipeline with a stage of its own between the STT and the LLM (or an LLM group under another name) still
serves. The two ends are the pipeline's by definition: the first stage is the source (the session's socket
stands in for it) and the last the sink.
"""
from __future__ import annotations

from dataclasses import dataclass

from s2s.config import StageSpec
from s2s.config_errors import ConfigError
from s2s.graph import makes
from s2s.messages import AudioChunk, ReplyAudio, SpeechSegment, Transcript


def _first(specs: list[StageSpec], accepts: type | None = None, makes_kind: type | None = None) -> StageSpec | None:
    for spec in specs:
        if accepts is not None and any(issubclass(accepts, kind) for kind in spec.cls.accepts):
            return spec
        if makes_kind is not None and any(issubclass(kind, makes_kind) for kind in makes(spec.cls)):  # type: ignore[arg-type]
            return spec
    return None


@dataclass(frozen=True)
class Roles:
    """A session's stages by role.

    Attributes:
        source, sink: the pipeline's two ends (each session puts its socket there).
        vad: the first stage that takes the input audio; it belongs to the session (its settings are per client).
        stt: the first that takes a speech segment (None: none; a client's committed buffer goes to it).
        llm: the first that takes a transcript (typed turns are handed to it).
        tts: the last before the sink that makes reply audio.
        pooled: the stages between the VAD and the sink, set up once and lent to one session at a time.
    """

    source: StageSpec
    vad: StageSpec
    stt: StageSpec | None
    llm: StageSpec
    tts: StageSpec
    sink: StageSpec
    pooled: list[StageSpec]


def shown(specs: list[StageSpec]) -> str:
    return "[" + ", ".join(spec.group for spec in specs) + "]"


def shape_errors(specs: list[StageSpec]) -> list[ConfigError]:
    """What keeps ``specs`` from serving sessions: source, a VAD taking audio, ..., an STT making transcripts,
    an LLM taking them, ..., a stage making reply audio, sink."""
    if len(specs) < 4:
        return [ConfigError("pipeline", shown(specs), "source, a VAD (accepts AudioChunk), ..., sink for "
                                                      "server=realtime")]
    inner = specs[1:-1]
    problems = []
    vad = _first(inner, accepts=AudioChunk)
    if vad is None:
        problems.append(ConfigError("pipeline", shown(specs), "a VAD that accepts AudioChunk after the source"))
    after = inner[inner.index(vad) + 1:] if vad is not None else inner
    if _first(after, accepts=Transcript) is None:
        problems.append(ConfigError("pipeline", shown(specs), "a stage after the VAD that accepts Transcript "
                                                              "(an LLM: typed turns are handed to it)"))
    elif _first(after, makes_kind=Transcript) is None:  # stt=none: the LLM hears the audio, no words come out
        problems.append(ConfigError("stt", "none", "an STT with server=realtime: a session's user items, its "
                                    "transcription events and its history are the STT's words (stt=none runs "
                                    "without server=realtime)"))
    if _first(list(reversed(after)), makes_kind=ReplyAudio) is None:
        problems.append(ConfigError("pipeline", shown(specs), "a stage before the sink that emits ReplyAudio "
                                                              "(a TTS)"))
    return problems


def find_roles(specs: list[StageSpec]) -> Roles:
    """The roles of ``specs``, which :func:`shape_errors` found nothing wrong with (else ValueError)."""
    if problems := shape_errors(specs):
        raise ValueError("; ".join(str(problem) for problem in problems))
    inner = specs[1:-1]
    vad = _first(inner, accepts=AudioChunk)
    assert vad is not None
    pooled = inner[inner.index(vad) + 1:]
    llm, tts = _first(pooled, accepts=Transcript), _first(list(reversed(pooled)), makes_kind=ReplyAudio)
    assert llm is not None and tts is not None
    return Roles(specs[0], vad, _first(pooled, accepts=SpeechSegment), llm, tts, specs[-1], pooled)

"""What a client may change about its session (``session.update``), and how the session shows it.

:class:`SessionSettings` is a value: :meth:`SessionSettings.apply` checks a whole update first and returns new
settings, or raises :class:`~s2s.server.protocol.ProtocolError` having changed nothing, so an update applies
whole or not at all. What the stages accept is asked of :class:`Rules` (the configured TTS for a voice, the
configured VAD for turn detection, the LLM for instructions and tools).
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from s2s.config import StageSpec
from s2s.llm.base import LLMStage
from s2s.server.pipelines import override_errors
from s2s.server.protocol import DEFAULT_RATE, ProtocolError, SessionUpdate, TurnDetection, silence_ms
from s2s.server.tools import accepts_client_tools

# the Realtime API's own voice names: SDKs send one by default (openai-agents sends 'ash')
OPENAI_VOICES = ("alloy", "ash", "ballad", "cedar", "coral", "echo", "marin", "sage", "shimmer", "verse")


class Rules(Protocol):
    """What the session's stages accept; each method returns why not, or None."""

    def voice_locked(self) -> bool: ...  # the graph runs with its TTS: the voice is fixed

    def voice_problem(self, voice: str) -> str | None: ...

    def speed_problem(self, speed: float) -> str | None: ...

    def instructions_problem(self) -> str | None: ...

    def vad_problem(self, overrides: dict[str, Any]) -> str | None: ...

    def tools_problem(self, tools: list[dict[str, Any]]) -> str | None: ...

    def language_problem(self, language: str) -> str | None: ...


class StageRules:
    """:class:`Rules` from the composed config: a stage's own validation judges a client's value.

    Args:
        cfg: the composed config.
        vad_spec: the configured VAD (turn detection maps onto its keys).
        tts_spec: the configured TTS (the voice is its key).
        llm: the session's pooled LLM stage.
        voice_locked: whether the session's graph (and so its TTS) has been built.
        stt_spec: the configured STT (the transcription language is its ``language`` key), if there is one.
    """

    def __init__(self, cfg: Any, vad_spec: StageSpec, tts_spec: StageSpec, llm: Any,
                 voice_locked: Callable[[], bool], stt_spec: StageSpec | None = None) -> None:
        self.cfg, self.vad_spec, self.tts_spec, self.llm = cfg, vad_spec, tts_spec, llm
        self.voice_locked, self.stt_spec = voice_locked, stt_spec

    def _problem(self, spec: StageSpec, overrides: dict[str, Any]) -> str | None:
        errors = override_errors(self.cfg, spec, overrides)
        if not errors:
            return None
        first = errors[0]
        return (f"{first.key.split('.')[-1]}={first.value!s} is not accepted by {spec.group}="
                f"{spec.target.rsplit('.', 1)[-1]}; expected {first.expected}")

    def _tts_key(self, kind: str) -> str | None:
        return self.tts_spec.cls.voice_key if kind == "voice" else self.tts_spec.cls.speed_key

    def voice_problem(self, voice: str) -> str | None:
        if (key := self._tts_key("voice")) is None:
            return f"tts={self.tts_spec.target.rsplit('.', 1)[-1]} has no named voices; it speaks with its one voice"
        return self._problem(self.tts_spec, {key: voice})

    def speed_problem(self, speed: float) -> str | None:
        if (key := self._tts_key("speed")) is None:
            return f"tts={self.tts_spec.target.rsplit('.', 1)[-1]} has no speaking rate setting; only 1.0 applies"
        return self._problem(self.tts_spec, {key: speed})

    def response_voice_problem(self, voice: str) -> str | None:
        """Why the TTS cannot say one response in ``voice`` (its voice changes in place, or not at all)."""
        if (key := self._tts_key("voice")) is not None and key not in self.tts_spec.cls.runtime_keys:
            return (f"tts={self.tts_spec.target.rsplit('.', 1)[-1]} loads its voice with its model: set it with "
                    f"session.update before the first audio, not per response")
        return self.voice_problem(voice)

    def language_problem(self, language: str) -> str | None:
        spec = self.stt_spec
        if spec is None or "language" not in inspect.signature(spec.cls).parameters:
            return f"{spec.group if spec else 'the STT'} takes no language; it transcribes in its own"
        return self._problem(spec, {"language": language})

    def builtin_voice(self, voice: str, current: str | None) -> bool:
        """``voice`` is one of the Realtime API's own voices (an SDK default, e.g. 'ash') that this TTS lacks.

        Such a name means "the server's voice": the configured one stays, and no error is raised.
        """
        return voice in OPENAI_VOICES and voice != current and self.voice_problem(voice) is not None

    def configured(self, kind: str) -> Any:
        """The configured TTS's voice (None: its only or default one) or speed (1.0 when it has no such key)."""
        key = self._tts_key(kind)
        value = self.tts_spec.kwargs.get(key) if key else None
        return (1.0 if value is None else float(value)) if kind == "speed" else value

    def tts_overrides(self, voice: str | None, speed: float) -> dict[str, Any]:
        """The TTS keys a session's own TTS needs for this voice and speed (empty: the pooled one will do)."""
        wanted = {"voice": voice, "speed": speed}
        return {self._tts_key(kind): value for kind, value in wanted.items() if value != self.configured(kind)}

    def instructions_problem(self) -> str | None:
        return None if isinstance(self.llm, LLMStage) else f"llm {type(self.llm).__name__} takes no instructions"

    def vad_problem(self, overrides: dict[str, Any]) -> str | None:
        return self._problem(self.vad_spec, overrides)

    def tools_problem(self, tools: list[dict[str, Any]]) -> str | None:
        return accepts_client_tools(self.llm) if tools else None


@dataclass(frozen=True)
class SessionSettings:
    """A session's client-facing settings, starting from the composed config.

    Args:
        instructions: the LLM's system prompt.
        voice: the TTS voice (its ``voice_key`` value; None: the TTS's only or default voice).
        vad_defaults: the configured VAD's keys (what server_vad shows for a value the client never set).
        input_rate: the rate of the client's PCM16 appends.
        output_rate: the rate of the reply's PCM16 deltas.
        turn_detection: server_vad, semantic_vad or manual turns.
        tools: function tools the client runs.
        tool_choice: auto, none, or ``{"type": "function", "name": ...}``.
        speed: the speaking rate (the TTS's ``speed_key``; 1.0 where it has none).
        transcription: whether the client hears transcripts of its speech (off: ``transcription`` null).
        text_only: output_modalities ["text"]: replies in text, not said aloud.
        visemes: whether replies carry ``speech_to_speech.output_audio.visemes`` events (from a response's start).
        transcription_language: the language its speech is transcribed in (None: the STT's own).
        max_output_tokens: every reply's token cap (None: "inf", the LLM's own ``max_new_tokens``).
    """

    instructions: str | None
    voice: str | None
    vad_defaults: Mapping[str, Any] = field(default_factory=dict)
    input_rate: int = DEFAULT_RATE
    output_rate: int = DEFAULT_RATE
    turn_detection: TurnDetection = field(default_factory=TurnDetection)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    speed: float = 1.0
    transcription: bool = True
    text_only: bool = False
    visemes: bool = False
    transcription_language: str | None = None
    max_output_tokens: int | None = None

    @property
    def vad_overrides(self) -> dict[str, Any]:
        """The VAD keys the client changed (threshold, speech_pad_ms, the silence that ends a turn)."""
        return self.turn_detection.vad_overrides(self.vad_defaults.get("turn"))

    def apply(self, update: SessionUpdate, rules: Rules, event_id: str | None = None) -> SessionSettings:
        """The settings after ``update``, every part of it checked first.

        Args:
            update: the parsed ``session.update`` (only the fields the client named are set).
            rules: what the stages accept.
            event_id: the client's event id, echoed in an error.

        Returns:
            New settings; these stay as they were.

        Raises:
            ProtocolError: the first part of the update that cannot apply (nothing is applied).
        """
        for name, value, current in (("voice", update.voice, self.voice), ("speed", update.speed, self.speed)):
            if value is None or value == current:
                continue
            if rules.voice_locked():
                raise ProtocolError(f"cannot_update_{name}", f"the {name} can only change before the first audio "
                                    f"or response", f"session.audio.output.{name}", event_id)
            problem = rules.voice_problem(value) if name == "voice" else rules.speed_problem(value)
            if problem:
                raise ProtocolError("invalid_value", problem, f"session.audio.output.{name}", event_id)
        if update.instructions is not None and (problem := rules.instructions_problem()):
            raise ProtocolError("invalid_value", problem, "session.instructions", event_id)
        if update.turn_detection is not None and (problem := rules.vad_problem(
                update.turn_detection.vad_overrides(self.vad_defaults.get("turn")))):
            raise ProtocolError("invalid_value", problem, "session.audio.input.turn_detection", event_id)
        if update.tools is not None and (problem := rules.tools_problem(update.tools)):
            raise ProtocolError("tools_not_supported", problem, "session.tools", event_id)
        language = update.transcription_language
        if language is not None and (problem := rules.language_problem(language)):
            raise ProtocolError("invalid_value", problem, "session.audio.input.transcription.language", event_id)
        tools = self.tools if update.tools is None else update.tools
        choice = update.tool_choice
        if isinstance(choice, dict) and choice["name"] not in [tool["name"] for tool in tools]:
            raise ProtocolError("invalid_value", f"tool_choice names '{choice['name']}', which is not one of the "
                                f"session's tools", "session.tool_choice.name", event_id)
        named = {key: getattr(update, key) for key in ("instructions", "voice", "input_rate", "output_rate",
                                                         "turn_detection", "tools", "tool_choice", "speed",
                                                         "transcription", "text_only", "visemes")}
        named = {key: value for key, value in named.items() if value is not None}
        if update.transcription is not None:  # the transcription object replaces the last one, language included
            named["transcription_language"] = language
        if update.max_output_tokens is not None:
            named["max_output_tokens"] = None if update.max_output_tokens == "inf" else update.max_output_tokens
        return dataclasses.replace(self, **named)

    def view(self, session_id: str, model: str, transcription_model: str,
             transcription_language: str | None = None) -> dict[str, Any]:
        """The session object that ``session.created`` and ``session.updated`` show: the settings in force.

        Keys that cannot apply show the server's own value (no tracing, no noise reduction, no stored prompt),
        never what a client asked for.

        Args:
            session_id: the session's id.
            model: what the client named in ``?model=``.
            transcription_model: the configured STT's model, which serves any transcription model named.
            transcription_language: the configured STT's language (None: detected per turn), unless the session
                has its own.
        """
        detection = self.turn_detection
        vad = {**self.vad_defaults, **self.vad_overrides}
        language = self.transcription_language or transcription_language
        transcription = {"model": transcription_model, **({"language": language} if language else {})}
        shown: dict[str, Any] | None
        if detection.manual:
            shown = None
        elif detection.kind == "semantic_vad":
            shown = {"type": "semantic_vad", "eagerness": detection.eagerness,
                     "interrupt_response": detection.interrupt_response, "create_response": True}
        else:
            shown = {"type": "server_vad", "threshold": vad.get("threshold"),
                     "silence_duration_ms": silence_ms(vad), "prefix_padding_ms": vad.get("speech_pad_ms"),
                     "idle_timeout_ms": detection.idle_timeout_ms, "interrupt_response": detection.interrupt_response,
                     "create_response": True}
        return {
            "type": "realtime", "object": "realtime.session", "id": session_id, "model": model,
            "output_modalities": ["text" if self.text_only else "audio"], "instructions": self.instructions or "",
            "tools": self.tools, "tool_choice": self.tool_choice, "tracing": None, "prompt": None,
            "max_output_tokens": self.max_output_tokens or "inf", "truncation": "auto",
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": self.input_rate},
                          "transcription": transcription if self.transcription else None,
                          "noise_reduction": None, "turn_detection": shown},
                "output": {"format": {"type": "audio/pcm", "rate": self.output_rate}, "voice": self.voice,
                           "speed": self.speed, **({"visemes": True} if self.visemes else {})}},  # an extension
        }

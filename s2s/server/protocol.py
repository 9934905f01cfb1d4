"""The OpenAI Realtime protocol subset the server speaks: parsing and checking client events, building server events.

Everything a client sends is checked here before it reaches a session: a bad event becomes a
:class:`ProtocolError`, which the server turns into an ``error`` event; the session goes on. ``session.update``
maps onto an explicit allowlist of keys, so a client never reaches the composed config or a ``_target_``.
"""
from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

import numpy as np

from s2s.server.settings import ServerSettings
from s2s.usage import Usage

DEFAULT_RATE = 24000  # the Realtime API's PCM16 rate
CLIENT_EVENTS = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                 "input_audio_buffer.clear", "response.create", "response.cancel", "conversation.item.create",
                 "conversation.item.retrieve", "conversation.item.delete", "conversation.item.truncate")


class ProtocolError(ValueError):
    """A client event the server refuses; becomes an ``error`` event with ``code`` and ``param``."""

    def __init__(self, code: str, message: str, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.event_id = code, message, param, event_id


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


# semantic_vad's eagerness -> the silence that ends a turn: under turn=silence the VAD's min_silence_ms; under a
# detector that judges the pause (turn=fused, words, smart_turn) its longest wait, turn.max_silence_ms, which must
# outlast a pause inside a sentence. auto (and medium, for a judge) keeps the configured value.
EAGERNESS_SILENCE_MS: dict[str, int | None] = {"low": 800, "medium": 600, "high": 400, "auto": None}
EAGERNESS_WAIT_MS: dict[str, int | None] = {"low": 2000, "medium": None, "high": 800, "auto": None}


def judges(turn: Mapping[str, Any] | None) -> bool:
    """The configured ``turn`` judges a pause (its longest wait is ``turn.max_silence_ms``), not ``turn=silence``."""
    from s2s.vad import turn_detection

    return isinstance(turn_detection.settings(turn), turn_detection.JUDGES)


def silence_ms(vad: Mapping[str, Any]) -> int | None:
    """The silence that ends a turn under the VAD keys ``vad`` (what ``silence_duration_ms`` shows)."""
    from s2s.vad import turn_detection

    if judges(vad.get("turn")):
        return turn_detection.settings(vad.get("turn")).max_silence_ms
    return vad.get("min_silence_ms")


@dataclass(frozen=True)
class TurnDetection:
    """How a user turn ends: the server's VAD (server_vad, semantic_vad) or the client's commit (``kind`` none).

    Each server_vad setting maps onto a VAD constructor key (threshold, speech_pad_ms, and the silence: see
    :meth:`vad_overrides`); semantic_vad's ``eagerness`` maps onto that silence.
    """

    threshold: float | None = None
    silence_duration_ms: int | None = None
    prefix_padding_ms: int | None = None
    interrupt_response: bool = True
    kind: str = "server_vad"  # server_vad | semantic_vad | none (turn_detection null: manual turns)
    eagerness: str | None = None  # semantic_vad only
    idle_timeout_ms: int | None = None  # server_vad: the user's silence after a reply that prompts another

    @property
    def manual(self) -> bool:
        """No automatic turn end: the client commits the input buffer."""
        return self.kind == "none"

    def vad_overrides(self, turn: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The VAD keys this turn detection changes, given the configured ``turn`` group.

        ``silence_duration_ms`` (or eagerness) is the silence that ends a turn: ``vad.min_silence_ms`` under
        ``turn=silence``, the judging detector's longest wait (``turn.max_silence_ms``) otherwise.
        """
        judged = judges(turn)
        if self.kind == "semantic_vad":
            silence = (EAGERNESS_WAIT_MS if judged else EAGERNESS_SILENCE_MS).get(self.eagerness or "auto")
        else:
            silence = self.silence_duration_ms
        mapping = {} if self.kind == "semantic_vad" else {"threshold": self.threshold,
                                                          "speech_pad_ms": self.prefix_padding_ms}
        if silence is not None and judged:
            mapping["turn"] = {**(turn or {}), "max_silence_ms": silence}
        elif silence is not None:
            mapping["min_silence_ms"] = silence
        return {key: value for key, value in mapping.items() if value is not None}


@dataclass
class SessionUpdate:
    """The checked content of one ``session.update``: only fields the client named are set.

    ``acknowledged`` holds the keys that were accepted but cannot apply to this pipeline (tracing,
    noise_reduction, prompt, ...), by their path, for the log.
    """

    instructions: str | None = None
    voice: str | None = None
    input_rate: int | None = None
    output_rate: int | None = None
    turn_detection: TurnDetection | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    speed: float | None = None
    transcription: bool | None = None  # False: the client set transcription null (no transcription events)
    text_only: bool | None = None  # output_modalities ["text"]: replies in text, not said aloud
    visemes: bool | None = None  # audio.output.visemes: speech_to_speech.output_audio.visemes events (extension)
    transcription_language: str | None = None  # with ``transcription`` on: its language (None: the STT's own)
    max_output_tokens: int | str | None = None  # a reply's token cap, or "inf" (the LLM's own)
    acknowledged: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientEvent:
    type: str
    event_id: str | None
    body: dict[str, Any] = field(default_factory=dict)


def parse_frame(frame: str | bytes, limits: ServerSettings) -> ClientEvent:
    """One WebSocket frame -> a client event of a known type (its fields are checked by the handlers)."""
    if len(frame) > limits.max_frame_bytes:
        raise ProtocolError("frame_too_large", f"frame of {len(frame)} bytes is over the limit of "
                                               f"{limits.max_frame_bytes} bytes (server.max_frame_bytes); "
                                               f"send audio in smaller appends")
    try:
        event = json.loads(frame)
    except (ValueError, RecursionError) as error:
        raise ProtocolError("invalid_json", f"the frame is not valid JSON ({error})") from None
    if not isinstance(event, dict):
        raise ProtocolError("invalid_event", "an event is a JSON object with a 'type'")
    event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
    kind = event.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("missing_required_parameter", "the event has no 'type'", "type", event_id)
    if kind not in CLIENT_EVENTS:
        raise ProtocolError("unknown_event_type", f"unknown event type '{kind[:80]}'; this server handles: "
                                                  f"{', '.join(CLIENT_EVENTS)}", "type", event_id)
    return ClientEvent(kind, event_id, event)


def check_field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str, event_id: str | None,
           required: bool = True) -> Any:
    if name not in body:
        if required:
            raise ProtocolError("missing_required_parameter", f"missing required parameter '{where}{name}'",
                                f"{where}{name}", event_id)
        return None
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):  # True is an int too
        names = " or ".join(k.__name__ for k in kinds)
        raise ProtocolError("invalid_type", f"'{where}{name}' must be {names}, not {type(value).__name__}",
                            f"{where}{name}", event_id)
    return value


def check_keys(body: dict[str, Any], allowed: set[str], where: str, event_id: str | None) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ProtocolError("unknown_parameter", f"unknown parameter '{where}{unknown[0]}'; allowed here: "
                                                 f"{', '.join(sorted(allowed))}", f"{where}{unknown[0]}", event_id)


def decode_audio(event: ClientEvent) -> np.ndarray:
    """``input_audio_buffer.append`` -> int16 samples (little-endian PCM16 mono)."""
    check_keys(event.body, {"type", "event_id", "audio"}, "", event.event_id)
    data = check_field(event.body, "audio", str, "", event.event_id)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_audio", "'audio' is not valid base64", "audio", event.event_id) from None
    if len(raw) % 2:
        raise ProtocolError("invalid_audio", f"'audio' decodes to {len(raw)} bytes; PCM16 needs an even count",
                            "audio", event.event_id)
    return np.frombuffer(raw, dtype="<i2")


def encode_audio(samples: np.ndarray) -> str:
    """int16 samples -> base64 of little-endian PCM16."""
    return base64.b64encode(samples.astype("<i2").tobytes()).decode("ascii")


@dataclass
class Item:
    """A ``conversation.item.create`` item: user text, the output of a tool call, or a system or assistant
    message (history a client brings, e.g. the Agents SDK's ``updateHistory``)."""

    kind: str  # input_text | function_call_output | history (a system or assistant message)
    text: str
    call_id: str | None = None
    item_id: str = field(default_factory=lambda: new_id("item"))
    role: str = "user"  # of a message: user, system or assistant


# the content parts a message of each role may hold, and the key that carries each part's text
PART_TEXT = {"user": {"input_text": "text"}, "system": {"input_text": "text"},
             "assistant": {"output_text": "text", "output_audio": "transcript"}}


def parse_item_object(item: dict[str, Any], where: str, eid: str | None) -> Item:
    kind = check_field(item, "type", str, where, eid)
    item_id = item["id"] if isinstance(item.get("id"), str) and item["id"] else new_id("item")
    if kind == "function_call_output":
        check_keys(item, {"type", "id", "object", "status", "call_id", "output"}, where, eid)
        return Item(kind, check_field(item, "output", str, where, eid), check_field(item, "call_id", str, where, eid),
                    item_id)
    if kind != "message":
        raise ProtocolError("invalid_value", f"'{where}type' {kind!r} is not supported; expected 'message' "
                                             f"(with input_text) or 'function_call_output'", f"{where}type", eid)
    check_keys(item, {"type", "id", "object", "status", "role", "content"}, where, eid)
    role = item.get("role", "user")
    if role not in PART_TEXT:
        raise ProtocolError("invalid_value", f"'{where}role' {str(role)[:40]!r} is not one of user, system, "
                                             f"assistant", f"{where}role", eid)
    content = check_field(item, "content", list, where, eid)
    texts = []
    for index, part in enumerate(content):
        key = PART_TEXT[role].get(part.get("type")) if isinstance(part, dict) else None
        if key is None or not isinstance(part.get(key), str):
            shown = " or ".join(f"{{'type': '{kind}', '{text}': ...}}" for kind, text in PART_TEXT[role].items())
            raise ProtocolError("invalid_value", f"'{where}content[{index}]' of a {role} message must be {shown}",
                                f"{where}content[{index}]", eid)
        texts.append(part[key])
    text = " ".join(t.strip() for t in texts).strip()
    if not text:
        raise ProtocolError("invalid_value", "the message has no text", f"{where}content", eid)
    return Item("input_text" if role == "user" else "history", text, None, item_id, role)


def parse_item(event: ClientEvent) -> Item:
    eid = event.event_id
    check_keys(event.body, {"type", "event_id", "item", "previous_item_id"}, "", eid)
    return parse_item_object(check_field(event.body, "item", dict, "", eid), "item.", eid)


@dataclass
class ItemRequest:
    """``conversation.item.retrieve``, ``.delete`` or ``.truncate`` of one item."""

    kind: str  # retrieve | delete | truncate
    item_id: str
    event_id: str | None
    audio_end_ms: int = 0  # truncate: the audio the user heard
    content_index: int = 0


def parse_item_request(event: ClientEvent) -> ItemRequest:
    eid = event.event_id
    kind = event.type.rsplit(".", 1)[-1]
    extra = {"audio_end_ms", "content_index"} if kind == "truncate" else set()
    check_keys(event.body, {"type", "event_id", "item_id", *extra}, "", eid)
    request = ItemRequest(kind, check_field(event.body, "item_id", str, "", eid), eid)
    if kind == "truncate":
        request.audio_end_ms = check_field(event.body, "audio_end_ms", int, "", eid)
        request.content_index = check_field(event.body, "content_index", int, "", eid, required=False) or 0
        if request.audio_end_ms < 0 or request.content_index != 0:
            param = "audio_end_ms" if request.audio_end_ms < 0 else "content_index"
            raise ProtocolError("invalid_value", f"'{param}' must be {'0 or more' if param == 'audio_end_ms' else 0} "
                                                 f"(one audio part per assistant item)", param, eid)
    return request


@dataclass
class ResponseRequest:
    """What a ``response.create`` asks of this response alone (unset fields: the session's settings hold)."""

    instructions: str | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    out_of_band: bool = False  # conversation "none": the reply stays out of the conversation and the history
    input: list[Item] | None = None  # its own input items instead of the conversation's new ones
    metadata: dict[str, Any] | None = None
    text_only: bool | None = None  # output_modalities ["text"] (None: the session's)
    voice: str | None = None  # audio.output.voice (None: the session's)
    output_rate: int | None = None  # audio.output.format's rate (None: the session's; another one is refused)
    max_output_tokens: int | str | None = None  # its token cap, or "inf" (the LLM's own); None: the session's


def check_bare(event: ClientEvent) -> None:
    check_keys(event.body, {"type", "event_id", "response_id"}, "", event.event_id)


# ---------------------------------------------------------------------------------------------- server events
def event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "event_id": new_id("event"), **fields}


def error_event(error: ProtocolError) -> dict[str, Any]:
    return event("error", error={"type": "invalid_request_error", "code": error.code, "message": error.message,
                                 "param": error.param, "event_id": error.event_id})


def dumps(server_event: dict[str, Any]) -> str:
    """A server event as the text of one WebSocket frame."""
    return json.dumps(server_event, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------- items, responses
def user_item_id(session_id: str, turn: int) -> str:
    """The id of the user's spoken item for ``turn`` (the same in speech_started, speech_stopped, transcript)."""
    return f"item_{session_id[-8:]}_{turn}"


def user_text_item(text: str) -> dict[str, Any]:
    return {"id": new_id("item"), "object": "realtime.item", "type": "message", "role": "user",
            "status": "completed", "content": [{"type": "input_text", "text": text}]}


def history_item(role: str, text: str) -> dict[str, Any]:
    """A system or assistant message a client added, as the conversation shows it."""
    part = {"type": "input_text", "text": text} if role == "system" else {"type": "output_text", "text": text}
    return {"id": new_id("item"), "object": "realtime.item", "type": "message", "role": role,
            "status": "completed", "content": [part]}


def function_output_item(call_id: str, output: str) -> dict[str, Any]:
    return {"id": new_id("item"), "object": "realtime.item", "type": "function_call_output", "call_id": call_id,
            "output": output}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": "completed", "object": "realtime.item"}


def assistant_item(item_id: str, transcript: str, completed: bool, text_only: bool = False) -> dict[str, Any]:
    """The reply of a response, spoken (its transcript) or text only; ``completed`` False when it was cut short."""
    part = {"type": "output_text", "text": transcript} if text_only else {"type": "output_audio",
                                                                           "transcript": transcript}
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
            "status": "completed" if completed else "incomplete", "content": [part]}


def response_object(response_id: str, status: str, output: list[dict[str, Any]] | None = None,
                    reason: str | None = None, metadata: dict[str, Any] | None = None,
                    out_of_band: bool = False, text_only: bool = False, usage: Usage | None = None) -> dict[str, Any]:
    details = None if status == "in_progress" else {"type": status, "reason": reason}
    shown = {"id": response_id, "object": "realtime.response", "status": status, "status_details": details,
             "output": output or [], "output_modalities": ["text" if text_only else "audio"], "metadata": metadata,
             "conversation_id": None if out_of_band else "conv_s2s"}
    return shown if usage is None else {**shown, "usage": usage_object(usage)}


def usage_object(usage: Usage) -> dict[str, Any]:
    """``response.usage`` as the Realtime API shapes it. The LLM reads and writes text only (the STT and TTS
    around it count no tokens): audio and image tokens are 0; cached tokens appear where the backend said."""
    cached = {} if usage.cached_tokens is None else {
        "cached_tokens": usage.cached_tokens,
        "cached_tokens_details": {"text_tokens": usage.cached_tokens, "audio_tokens": 0, "image_tokens": 0}}
    return {"total_tokens": usage.total_tokens, "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "input_token_details": {"text_tokens": usage.input_tokens, "audio_tokens": 0, "image_tokens": 0,
                                    **cached},
            "output_token_details": {"text_tokens": usage.output_tokens, "audio_tokens": 0}}

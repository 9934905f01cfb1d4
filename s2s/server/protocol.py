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
from typing import Any

import numpy as np

from s2s.server.settings import ServerSettings

DEFAULT_RATE = 24000  # the Realtime API's PCM16 rate
CLIENT_EVENTS = ("session.update", "input_audio_buffer.append", "response.create", "response.cancel",
                 "conversation.item.create")


class ProtocolError(ValueError):
    """A client event the server refuses; becomes an ``error`` event with ``code`` and ``param``."""

    def __init__(self, code: str, message: str, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.event_id = code, message, param, event_id


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass(frozen=True)
class TurnDetection:
    """server_vad settings; each maps onto a VAD constructor key (threshold, min_silence_ms, speech_pad_ms)."""

    threshold: float | None = None
    silence_duration_ms: int | None = None
    prefix_padding_ms: int | None = None
    interrupt_response: bool = True

    def vad_overrides(self) -> dict[str, Any]:
        mapping = {"threshold": self.threshold, "min_silence_ms": self.silence_duration_ms,
                   "speech_pad_ms": self.prefix_padding_ms}
        return {key: value for key, value in mapping.items() if value is not None}


@dataclass
class SessionUpdate:
    """The checked content of one ``session.update``: only fields the client named are set."""

    instructions: str | None = None
    voice: str | None = None
    input_rate: int | None = None
    output_rate: int | None = None
    turn_detection: TurnDetection | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None


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


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str, event_id: str | None,
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


def _only(body: dict[str, Any], allowed: set[str], where: str, event_id: str | None) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ProtocolError("unknown_parameter", f"unknown parameter '{where}{unknown[0]}'; allowed here: "
                                                 f"{', '.join(sorted(allowed))}", f"{where}{unknown[0]}", event_id)


def decode_audio(event: ClientEvent) -> np.ndarray:
    """``input_audio_buffer.append`` -> int16 samples (little-endian PCM16 mono)."""
    _only(event.body, {"type", "event_id", "audio"}, "", event.event_id)
    data = _field(event.body, "audio", str, "", event.event_id)
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


def _rate(node: Any, where: str, limits: ServerSettings, event_id: str | None) -> int | None:
    if not isinstance(node, dict):
        raise ProtocolError("invalid_type", f"'{where}' must be an object", where, event_id)
    _only(node, {"type", "rate"}, where + ".", event_id)
    kind = node.get("type", "audio/pcm")
    if kind != "audio/pcm":
        raise ProtocolError("invalid_value", f"'{where}.type' {kind!r} is not supported; expected 'audio/pcm' "
                                             f"(PCM16 mono)", f"{where}.type", event_id)
    rate = _field(node, "rate", int, where + ".", event_id, required=False)
    if rate is not None and not limits.min_rate <= rate <= limits.max_rate:
        raise ProtocolError("invalid_value", f"'{where}.rate' {rate} is out of range; expected "
                                             f"{limits.min_rate}-{limits.max_rate} Hz", f"{where}.rate", event_id)
    return rate


def _turn_detection(node: Any, where: str, event_id: str | None) -> TurnDetection:
    if not isinstance(node, dict):
        raise ProtocolError("invalid_value", f"'{where}' must be an object with type 'server_vad' (turning "
                                             f"server VAD off is not supported)", where, event_id)
    _only(node, {"type", "threshold", "silence_duration_ms", "prefix_padding_ms", "interrupt_response",
                 "create_response"}, where + ".", event_id)
    if node.get("type", "server_vad") != "server_vad":
        raise ProtocolError("invalid_value", f"'{where}.type' {node.get('type')!r} is not supported; expected "
                                             f"'server_vad'", f"{where}.type", event_id)
    if node.get("create_response", True) is not True:
        raise ProtocolError("invalid_value", f"'{where}.create_response' must be true: every user turn gets "
                                             f"a reply", f"{where}.create_response", event_id)
    threshold = _field(node, "threshold", (int, float), where + ".", event_id, required=False)
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise ProtocolError("invalid_value", f"'{where}.threshold' {threshold} is out of range; expected a "
                                             f"probability between 0 and 1", f"{where}.threshold", event_id)
    durations = {}
    for key, upper in (("silence_duration_ms", 10000), ("prefix_padding_ms", 5000)):
        value = _field(node, key, int, where + ".", event_id, required=False)
        if value is not None and not 0 <= value <= upper:
            raise ProtocolError("invalid_value", f"'{where}.{key}' {value} is out of range; expected "
                                                 f"0-{upper} ms", f"{where}.{key}", event_id)
        durations[key] = value
    interrupt = _field(node, "interrupt_response", bool, where + ".", event_id, required=False)
    return TurnDetection(None if threshold is None else float(threshold), durations["silence_duration_ms"],
                         durations["prefix_padding_ms"], True if interrupt is None else interrupt)


def _tools(value: Any, event_id: str | None) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ProtocolError("invalid_type", "'session.tools' must be a list of function tools", "session.tools",
                            event_id)
    tools = []
    for index, tool in enumerate(value):
        where = f"session.tools[{index}]."
        if not isinstance(tool, dict):
            raise ProtocolError("invalid_type", f"'{where[:-1]}' must be an object", where[:-1], event_id)
        _only(tool, {"type", "name", "description", "parameters"}, where, event_id)
        if tool.get("type", "function") != "function":
            raise ProtocolError("invalid_value", f"'{where}type' must be 'function'", where + "type", event_id)
        name = _field(tool, "name", str, where, event_id)
        description = _field(tool, "description", str, where, event_id, required=False) or ""
        parameters = _field(tool, "parameters", dict, where, event_id, required=False) or {"type": "object",
                                                                                            "properties": {}}
        tools.append({"type": "function", "name": name, "description": description, "parameters": parameters})
    return tools


def parse_session_update(event: ClientEvent, limits: ServerSettings) -> SessionUpdate:
    """Check a ``session.update`` against the allowlist; nothing outside it is ever applied.

    Only the form is checked here (known keys, types, ranges); whether the session's stages accept a value
    (a voice, VAD settings) is :meth:`SessionSettings.apply <s2s.server.session_settings.SessionSettings.apply>`'s
    business.

    Args:
        event: the client event.
        limits: the server's limits (instruction length, PCM16 rates).

    Returns:
        The update, with only the fields the client named set.

    Raises:
        ProtocolError: the first key that is unknown, of the wrong type or out of range.
    """
    eid = event.event_id
    _only(event.body, {"type", "event_id", "session"}, "", eid)
    session = _field(event.body, "session", dict, "", eid)
    _only(session, {"type", "model", "instructions", "audio", "tools", "tool_choice", "output_modalities"},
          "session.", eid)
    if session.get("type", "realtime") != "realtime":
        raise ProtocolError("invalid_session_type", f"'session.type' {session.get('type')!r} is not supported; "
                                                    f"expected 'realtime'", "session.type", eid)
    _field(session, "model", str, "session.", eid, required=False)  # accepted and ignored: the config decides
    modalities = _field(session, "output_modalities", list, "session.", eid, required=False)
    if modalities is not None and "audio" not in modalities:
        raise ProtocolError("invalid_value", "'session.output_modalities' must include 'audio'",
                            "session.output_modalities", eid)
    update = SessionUpdate()
    update.instructions = _field(session, "instructions", str, "session.", eid, required=False)
    if update.instructions is not None and len(update.instructions) > limits.max_instructions_chars:
        raise ProtocolError("invalid_value", f"'session.instructions' has {len(update.instructions)} characters; "
                                             f"at most {limits.max_instructions_chars}", "session.instructions", eid)
    if "tools" in session:
        update.tools = _tools(session["tools"], eid)
    choice = _field(session, "tool_choice", str, "session.", eid, required=False)
    if choice is not None and choice not in ("auto", "none"):
        raise ProtocolError("invalid_value", f"'session.tool_choice' {choice!r}; expected 'auto' or 'none'",
                            "session.tool_choice", eid)
    update.tool_choice = choice
    audio = _field(session, "audio", dict, "session.", eid, required=False) or {}
    _only(audio, {"input", "output"}, "session.audio.", eid)
    audio_in = _field(audio, "input", dict, "session.audio.", eid, required=False) or {}
    _only(audio_in, {"format", "turn_detection", "transcription"}, "session.audio.input.", eid)
    if "format" in audio_in:
        update.input_rate = _rate(audio_in["format"], "session.audio.input.format", limits, eid) or DEFAULT_RATE
    if "turn_detection" in audio_in:
        update.turn_detection = _turn_detection(audio_in["turn_detection"], "session.audio.input.turn_detection",
                                                eid)
    if audio_in.get("transcription") is not None:  # transcripts always come; the configured STT makes them
        _field(audio_in, "transcription", dict, "session.audio.input.", eid)
    audio_out = _field(audio, "output", dict, "session.audio.", eid, required=False) or {}
    _only(audio_out, {"format", "voice"}, "session.audio.output.", eid)
    if "format" in audio_out:
        update.output_rate = _rate(audio_out["format"], "session.audio.output.format", limits, eid) or DEFAULT_RATE
    update.voice = _field(audio_out, "voice", str, "session.audio.output.", eid, required=False)
    return update


@dataclass
class Item:
    """A ``conversation.item.create`` item: user text or the output of a tool call."""

    kind: str  # input_text | function_call_output
    text: str
    call_id: str | None = None


def parse_item(event: ClientEvent) -> Item:
    eid = event.event_id
    _only(event.body, {"type", "event_id", "item", "previous_item_id"}, "", eid)
    item = _field(event.body, "item", dict, "", eid)
    kind = _field(item, "type", str, "item.", eid)
    if kind == "function_call_output":
        _only(item, {"type", "id", "object", "status", "call_id", "output"}, "item.", eid)
        return Item(kind, _field(item, "output", str, "item.", eid), _field(item, "call_id", str, "item.", eid))
    if kind != "message":
        raise ProtocolError("invalid_value", f"'item.type' {kind!r} is not supported; expected 'message' "
                                             f"(with input_text) or 'function_call_output'", "item.type", eid)
    _only(item, {"type", "id", "object", "status", "role", "content"}, "item.", eid)
    if item.get("role", "user") != "user":
        raise ProtocolError("invalid_value", "only 'user' messages can be added", "item.role", eid)
    content = _field(item, "content", list, "item.", eid)
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "input_text" or not isinstance(part.get("text"), str):
            raise ProtocolError("invalid_value", f"'item.content[{index}]' must be {{'type': 'input_text', "
                                                 f"'text': ...}}", f"item.content[{index}]", eid)
        texts.append(part["text"])
    text = " ".join(t.strip() for t in texts).strip()
    if not text:
        raise ProtocolError("invalid_value", "the message has no text", "item.content", eid)
    return Item("input_text", text)


def check_response_create(event: ClientEvent) -> None:
    _only(event.body, {"type", "event_id", "response"}, "", event.event_id)
    response = _field(event.body, "response", dict, "", event.event_id, required=False) or {}
    _only(response, {"output_modalities", "metadata"}, "response.", event.event_id)


def check_bare(event: ClientEvent) -> None:
    _only(event.body, {"type", "event_id", "response_id"}, "", event.event_id)


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


def function_output_item(call_id: str, output: str) -> dict[str, Any]:
    return {"id": new_id("item"), "object": "realtime.item", "type": "function_call_output", "call_id": call_id,
            "output": output}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": "completed", "object": "realtime.item"}


def assistant_item(item_id: str, transcript: str, completed: bool) -> dict[str, Any]:
    """The spoken reply of a response; ``completed`` False when it was cut short (cancelled, failed)."""
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
            "status": "completed" if completed else "incomplete",
            "content": [{"type": "output_audio", "transcript": transcript}]}


def response_object(response_id: str, status: str, output: list[dict[str, Any]] | None = None,
                    reason: str | None = None) -> dict[str, Any]:
    details = None if status == "in_progress" else {"type": status, "reason": reason}
    return {"id": response_id, "object": "realtime.response", "status": status, "status_details": details,
            "output": output or [], "output_modalities": ["audio"]}

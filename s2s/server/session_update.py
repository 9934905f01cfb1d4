"""``session.update`` and ``response.create``: the Realtime API's settings, checked against an explicit allowlist.

Every key of the API's session schema is either applied (instructions, tools, tool_choice, voice, speed, audio
formats, turn detection, transcription on or off and its language, max_output_tokens) or accepted and left alone
because nothing in a local pipeline serves it (tracing, noise reduction, a stored prompt, ...): the official clients send several of those
by default, and a refused update would lose its instructions and tools with them. A key outside the schema, or
a bad value in a known key, is a :class:`~s2s.server.protocol.ProtocolError` naming its ``param``, and nothing of
that update applies. No client key ever reaches a config path or a ``_target_``.

Only the form is checked here (known keys, types, ranges); whether the session's stages accept a value (a
voice, VAD settings) is :meth:`SessionSettings.apply <s2s.server.session_settings.SessionSettings.apply>`'s
business.
"""
from __future__ import annotations

from typing import Any

from s2s.server.protocol import (DEFAULT_RATE, EAGERNESS_SILENCE_MS, ClientEvent, ProtocolError, ResponseRequest,
                                 SessionUpdate, TurnDetection, check_field, check_keys, parse_item_object)
from s2s.server.settings import ServerSettings

SESSION_KEYS = {"type", "model", "instructions", "audio", "tools", "tool_choice", "output_modalities", "tracing",
                "include", "prompt", "max_output_tokens", "truncation", "parallel_tool_calls", "reasoning"}
# accepted and left alone: nothing in a local pipeline serves them (what each client sends: the README's Server section)
ACKNOWLEDGED = ("tracing", "include", "prompt", "truncation", "parallel_tool_calls", "reasoning")
SERVER_VAD_KEYS = {"type", "threshold", "silence_duration_ms", "prefix_padding_ms", "interrupt_response",
                   "create_response", "idle_timeout_ms"}
SEMANTIC_VAD_KEYS = {"type", "eagerness", "interrupt_response", "create_response", "model_version"}
TRANSCRIPTION_KEYS = {"model", "language", "prompt", "delay", "keywords", "languages"}


def _error(message: str, param: str, event_id: str | None, code: str = "invalid_value") -> ProtocolError:
    return ProtocolError(code, message, param, event_id)


def _rate(node: Any, where: str, limits: ServerSettings, event_id: str | None) -> int:
    if not isinstance(node, dict):
        raise _error(f"'{where}' must be an object", where, event_id, "invalid_type")
    check_keys(node, {"type", "rate"}, where + ".", event_id)
    kind = node.get("type", "audio/pcm")
    if kind != "audio/pcm":
        raise _error(f"'{where}.type' {kind!r} is not supported; expected 'audio/pcm' (PCM16 mono)",
                     f"{where}.type", event_id)
    rate = check_field(node, "rate", int, where + ".", event_id, required=False)
    if rate is not None and not limits.min_rate <= rate <= limits.max_rate:
        raise _error(f"'{where}.rate' {rate} is out of range; expected {limits.min_rate}-{limits.max_rate} Hz",
                     f"{where}.rate", event_id)
    return rate or DEFAULT_RATE


def _ms(node: dict[str, Any], key: str, upper: int, where: str, event_id: str | None) -> int | None:
    value = check_field(node, key, int, where + ".", event_id, required=False)
    if value is not None and not 0 <= value <= upper:
        raise _error(f"'{where}.{key}' {value} is out of range; expected 0-{upper} ms", f"{where}.{key}", event_id)
    return value


def _turn_detection(node: Any, where: str, event_id: str | None) -> TurnDetection:
    """server_vad, semantic_vad, or null: manual turns (no automatic turn end, the client commits)."""
    if node is None:
        return TurnDetection(kind="none")
    if not isinstance(node, dict):
        raise _error(f"'{where}' must be an object or null", where, event_id, "invalid_type")
    kind = node.get("type", "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise _error(f"'{where}.type' {kind!r} is not supported; expected 'server_vad' or 'semantic_vad' (or "
                     f"turn_detection null for manual turns)", f"{where}.type", event_id)
    check_keys(node, SERVER_VAD_KEYS if kind == "server_vad" else SEMANTIC_VAD_KEYS, where + ".", event_id)
    if check_field(node, "create_response", bool, where + ".", event_id, required=False) is False:
        raise _error(f"'{where}.create_response' false is not supported: every user turn the server detects "
                     f"gets a reply (use turn_detection null and commit the buffer to decide yourself)",
                     f"{where}.create_response", event_id)
    interrupt = check_field(node, "interrupt_response", bool, where + ".", event_id, required=False)
    interrupt = True if interrupt is None else interrupt
    if kind == "semantic_vad":
        eagerness = check_field(node, "eagerness", str, where + ".", event_id, required=False)
        if eagerness is not None and eagerness not in EAGERNESS_SILENCE_MS:
            raise _error(f"'{where}.eagerness' {eagerness!r} is not one of {', '.join(EAGERNESS_SILENCE_MS)}",
                         f"{where}.eagerness", event_id)
        check_field(node, "model_version", str, where + ".", event_id, required=False)
        return TurnDetection(interrupt_response=interrupt, kind=kind, eagerness=eagerness or "auto")
    threshold = check_field(node, "threshold", (int, float), where + ".", event_id, required=False)
    if threshold is not None and not 0.0 < threshold < 1.0:
        raise _error(f"'{where}.threshold' {threshold} is out of range; expected a probability between 0 and 1",
                     f"{where}.threshold", event_id)
    return TurnDetection(None if threshold is None else float(threshold),
                         _ms(node, "silence_duration_ms", 10000, where, event_id),
                         _ms(node, "prefix_padding_ms", 5000, where, event_id), interrupt,
                         idle_timeout_ms=_ms(node, "idle_timeout_ms", 600000, where, event_id))


def _transcription(node: Any, where: str, event_id: str | None) -> tuple[bool, str | None]:
    """(on, language): the configured STT serves any model, prompt, delay, keywords and languages named; a
    ``language`` is the session's (the STT judges it; absent: the configured one). null turns the events off."""
    if node is None:
        return False, None
    if not isinstance(node, dict):
        raise _error(f"'{where}' must be an object or null", where, event_id, "invalid_type")
    check_keys(node, TRANSCRIPTION_KEYS, where + ".", event_id)
    for key in ("model", "language", "prompt", "delay"):
        check_field(node, key, str, where + ".", event_id, required=False)
    for key in ("keywords", "languages"):
        values = check_field(node, key, list, where + ".", event_id, required=False) or []
        if not all(isinstance(value, str) for value in values):
            raise _error(f"'{where}.{key}' must be a list of strings", f"{where}.{key}", event_id, "invalid_type")
    return True, node.get("language") or None


def max_output_tokens(node: dict[str, Any], where: str, event_id: str | None) -> int | str | None:
    """``max_output_tokens``: 1-4096, or ``"inf"`` (the LLM's own cap); None when not given."""
    tokens = check_field(node, "max_output_tokens", (int, str), where, event_id, required=False)
    if (isinstance(tokens, str) and tokens != "inf") or (isinstance(tokens, int) and not 1 <= tokens <= 4096):
        raise _error(f"'{where}max_output_tokens' must be 1-4096 or 'inf'", f"{where}max_output_tokens", event_id)
    return tokens


def _noise_reduction(node: Any, where: str, event_id: str | None) -> None:
    if node is None:
        return
    if not isinstance(node, dict):
        raise _error(f"'{where}' must be an object or null", where, event_id, "invalid_type")
    check_keys(node, {"type", "strength"}, where + ".", event_id)
    if node.get("type", "near_field") not in ("near_field", "far_field"):
        raise _error(f"'{where}.type' must be 'near_field' or 'far_field'", f"{where}.type", event_id)
    check_field(node, "strength", (int, float), where + ".", event_id, required=False)


def _tools(value: Any, path: str, event_id: str | None) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _error(f"'{path}' must be a list of function tools", path, event_id, "invalid_type")
    tools = []
    for index, tool in enumerate(value):
        where = f"{path}[{index}]."
        if not isinstance(tool, dict):
            raise _error(f"'{where[:-1]}' must be an object", where[:-1], event_id, "invalid_type")
        if tool.get("type", "function") != "function":
            raise _error(f"'{where}type' {tool.get('type')!r} is not supported; this server runs no hosted tools "
                         f"(MCP): declare 'function' tools, which the client runs", where + "type", event_id)
        check_keys(tool, {"type", "name", "description", "parameters"}, where, event_id)
        name = check_field(tool, "name", str, where, event_id)
        description = check_field(tool, "description", str, where, event_id, required=False) or ""
        parameters = check_field(tool, "parameters", dict, where, event_id, required=False) or {
            "type": "object", "properties": {}}
        tools.append({"type": "function", "name": name, "description": description, "parameters": parameters})
    return tools


def parse_tool_choice(value: Any, where: str, event_id: str | None) -> str | dict[str, Any]:
    """auto, none, or ``{"type": "function", "name": ...}`` (the only tool the model is offered)."""
    if isinstance(value, str):
        if value in ("auto", "none"):
            return value
        raise _error(f"'{where}' {value!r} is not supported; expected 'auto', 'none' or {{'type': 'function', "
                     f"'name': ...}} ('required': the local LLMs cannot be made to call a tool)", where, event_id)
    if not isinstance(value, dict):
        raise _error(f"'{where}' must be a string or an object", where, event_id, "invalid_type")
    if value.get("type") != "function":
        raise _error(f"'{where}.type' {value.get('type')!r} is not supported; expected 'function'",
                     f"{where}.type", event_id)
    check_keys(value, {"type", "name"}, where + ".", event_id)
    return {"type": "function", "name": check_field(value, "name", str, where + ".", event_id)}


def _acknowledged(session: dict[str, Any], event_id: str | None) -> dict[str, Any]:
    """The keys that cannot apply, type-checked as the API defines them; their values are only logged."""
    kinds: dict[str, tuple[type, ...]] = {"tracing": (str, dict), "include": (list,), "prompt": (dict,),
                                          "truncation": (str, dict), "parallel_tool_calls": (bool,),
                                          "reasoning": (dict,)}
    named = {}
    for key in ACKNOWLEDGED:
        if key in session:
            if session[key] is not None:
                check_field(session, key, kinds[key], "session.", event_id)
            named[f"session.{key}"] = session[key]
    tracing = session.get("tracing")
    if isinstance(tracing, str) and tracing != "auto":
        raise _error("'session.tracing' must be 'auto', an object or null", "session.tracing", event_id)
    return named


def _voice(node: dict[str, Any], where: str, eid: str | None) -> str | None:
    """``voice``: a name, or a custom voice by id (``{"id": "voice_1234"}``); None when not given."""
    voice = node.get("voice")
    if isinstance(voice, dict):
        check_keys(voice, {"id"}, f"{where}voice.", eid)
        return check_field(voice, "id", str, f"{where}voice.", eid)
    return None if voice is None else check_field(node, "voice", str, where, eid)


def parse_session_update(event: ClientEvent, limits: ServerSettings) -> SessionUpdate:
    """Check a ``session.update`` against the allowlist; nothing outside it is ever applied.

    Args:
        event: the client event.
        limits: the server's limits (instruction length, PCM16 rates).

    Returns:
        The update, with only the fields the client named set.

    Raises:
        ProtocolError: the first key that is unknown, of the wrong type or out of range.
    """
    eid = event.event_id
    check_keys(event.body, {"type", "event_id", "session"}, "", eid)
    session = check_field(event.body, "session", dict, "", eid)
    check_keys(session, SESSION_KEYS, "session.", eid)
    if session.get("type", "realtime") != "realtime":
        raise ProtocolError("invalid_session_type", f"'session.type' {session.get('type')!r} is not supported; "
                                                    f"expected 'realtime'", "session.type", eid)
    check_field(session, "model", str, "session.", eid, required=False)  # accepted and ignored: the config decides
    update = SessionUpdate(acknowledged=_acknowledged(session, eid))
    update.text_only = text_only(session, "session.", eid)
    update.max_output_tokens = max_output_tokens(session, "session.", eid)
    update.instructions = check_field(session, "instructions", str, "session.", eid, required=False)
    if update.instructions is not None and len(update.instructions) > limits.max_instructions_chars:
        raise _error(f"'session.instructions' has {len(update.instructions)} characters; at most "
                     f"{limits.max_instructions_chars}", "session.instructions", eid)
    if "tools" in session:
        update.tools = _tools(session["tools"], "session.tools", eid)
    if session.get("tool_choice") is not None:
        update.tool_choice = parse_tool_choice(session["tool_choice"], "session.tool_choice", eid)
    audio = check_field(session, "audio", dict, "session.", eid, required=False) or {}
    check_keys(audio, {"input", "output"}, "session.audio.", eid)
    audio_in = check_field(audio, "input", dict, "session.audio.", eid, required=False) or {}
    check_keys(audio_in, {"format", "turn_detection", "transcription", "noise_reduction"}, "session.audio.input.",
               eid)
    if audio_in.get("format") is not None:
        update.input_rate = _rate(audio_in["format"], "session.audio.input.format", limits, eid)
    if "turn_detection" in audio_in:
        update.turn_detection = _turn_detection(audio_in["turn_detection"], "session.audio.input.turn_detection",
                                                eid)
    if "transcription" in audio_in:
        update.transcription, update.transcription_language = _transcription(
            audio_in["transcription"], "session.audio.input.transcription", eid)
    if "noise_reduction" in audio_in:
        _noise_reduction(audio_in["noise_reduction"], "session.audio.input.noise_reduction", eid)
        update.acknowledged["session.audio.input.noise_reduction"] = audio_in["noise_reduction"]
    audio_out = check_field(audio, "output", dict, "session.audio.", eid, required=False) or {}
    check_keys(audio_out, {"format", "voice", "speed", "visemes"}, "session.audio.output.", eid)
    # visemes: an extension of the reference system (huggingface/speech-to-speech), s2s/server/visemes.py
    update.visemes = check_field(audio_out, "visemes", bool, "session.audio.output.", eid, required=False)
    if audio_out.get("format") is not None:
        update.output_rate = _rate(audio_out["format"], "session.audio.output.format", limits, eid)
    update.voice = _voice(audio_out, "session.audio.output.", eid)
    speed = check_field(audio_out, "speed", (int, float), "session.audio.output.", eid, required=False)
    if speed is not None and not 0.25 <= speed <= 1.5:
        raise _error(f"'session.audio.output.speed' {speed} is out of range; expected 0.25-1.5",
                     "session.audio.output.speed", eid)
    update.speed = None if speed is None else float(speed)
    return update


# response.create: instructions, tools, tool_choice, conversation, input, metadata, output_modalities,
# max_output_tokens and audio.output (its voice; its format must be the session's) apply to that response;
# prompt, parallel_tool_calls and reasoning are accepted and left alone
def text_only(node: dict[str, Any], where: str, eid: str | None) -> bool | None:
    """``output_modalities``: ``["audio"]`` (spoken, with its transcript) or ``["text"]`` (text only, no audio);
    None when not given."""
    modalities = check_field(node, "output_modalities", list, where, eid, required=False)
    if modalities is None:
        return None
    if modalities not in (["audio"], ["text"]):
        raise ProtocolError("invalid_value", f"'{where}output_modalities' must be [\"audio\"] (spoken, with its "
                                             f"transcript) or [\"text\"] (text only)", f"{where}output_modalities", eid)
    return modalities == ["text"]


RESPONSE_KEYS = {"output_modalities", "metadata", "instructions", "tool_choice", "tools", "conversation", "input",
                 "max_output_tokens", "prompt", "parallel_tool_calls", "reasoning", "audio"}


def parse_response_create(event: ClientEvent, limits: ServerSettings) -> ResponseRequest:
    """Check a ``response.create``: what this one response asks for (its instructions, tools, input...)."""
    eid = event.event_id
    check_keys(event.body, {"type", "event_id", "response"}, "", eid)
    body = check_field(event.body, "response", dict, "", eid, required=False) or {}
    check_keys(body, RESPONSE_KEYS, "response.", eid)
    request = ResponseRequest(instructions=check_field(body, "instructions", str, "response.", eid, required=False),
                              metadata=check_field(body, "metadata", dict, "response.", eid, required=False),
                              text_only=text_only(body, "response.", eid))
    conversation = body.get("conversation", "auto")
    if conversation not in ("auto", "none"):
        raise ProtocolError("invalid_value", "'response.conversation' must be 'auto' or 'none'",
                            "response.conversation", eid)
    request.out_of_band = conversation == "none"
    request.max_output_tokens = max_output_tokens(body, "response.", eid)
    audio = check_field(body, "audio", dict, "response.", eid, required=False) or {}
    check_keys(audio, {"output"}, "response.audio.", eid)
    audio_out = check_field(audio, "output", dict, "response.audio.", eid, required=False) or {}
    check_keys(audio_out, {"format", "voice"}, "response.audio.output.", eid)
    if audio_out.get("format") is not None:
        request.output_rate = _rate(audio_out["format"], "response.audio.output.format", limits, eid)
    request.voice = _voice(audio_out, "response.audio.output.", eid)
    if body.get("input") is not None:
        items = check_field(body, "input", list, "response.", eid)
        request.input = [parse_item_object(item if isinstance(item, dict) else {"type": None},
                                           f"response.input[{index}].", eid) for index, item in enumerate(items)]
    if body.get("tools") is not None:
        request.tools = _tools(body["tools"], "response.tools", eid)
    if body.get("tool_choice") is not None:
        request.tool_choice = parse_tool_choice(body["tool_choice"], "response.tool_choice", eid)
    return request

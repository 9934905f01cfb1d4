"""session.update and response.create as the official clients send them: accepted, or refused by param.

The frames below are what @openai/agents-realtime 0.20 and openai-agents 0.24 send on connect (recorded from
the libraries against a listening socket); tests/test_agents_*.py run the libraries themselves.
"""
from __future__ import annotations

import json

import pytest

from s2s.server.protocol import ClientEvent, ProtocolError
from s2s.server.session_update import parse_response_create, parse_session_update
from s2s.server.settings import ServerSettings

LIMITS = ServerSettings(host="127.0.0.1", port=0, max_sessions=1, api_key=None, max_frame_bytes=1 << 20,
                        min_rate=8000, max_rate=48000, max_instructions_chars=20000, idle_timeout_s=60)
TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
AGENTS_JS = {"type": "session.update", "session": {
    "type": "realtime", "instructions": "Answer briefly.", "model": "gpt-realtime-2.1", "output_modalities": ["audio"],
    "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "noise_reduction": None,
                        "transcription": {"model": "gpt-4o-mini-transcribe"}, "turn_detection": {"type": "semantic_vad"}},
              "output": {"format": {"type": "audio/pcm", "rate": 24000}, "speed": 1}},
    "tools": [{**TOOL, "parameters": {"$schema": "http://json-schema.org/draft-07/schema#", **TOOL["parameters"]}}]}}
AGENTS_PY = {"type": "session.update", "session": {
    "type": "realtime", "instructions": "Answer briefly.", "model": "gpt-realtime-2.1", "output_modalities": ["audio"],
    "audio": {"input": {"format": {"rate": 24000, "type": "audio/pcm"}, "transcription": {"model": "gpt-4o-mini-transcribe"},
                        "turn_detection": {"type": "semantic_vad", "interrupt_response": True}},
              "output": {"format": {"rate": 24000, "type": "audio/pcm"}, "voice": "ash"}},
    "tools": [TOOL]}}
TRACING = {"type": "session.update", "session": {"type": "realtime", "tracing": "auto"}}


def parse(body):
    return parse_session_update(ClientEvent(body["type"], body.get("event_id"), json.loads(json.dumps(body))), LIMITS)


@pytest.mark.parametrize("frame", [AGENTS_JS, AGENTS_PY, TRACING], ids=["agents-js", "openai-agents", "tracing"])
def test_what_the_agents_sdks_send_on_connect_is_accepted(frame):
    update = parse(frame)
    if frame is TRACING:
        assert update.acknowledged == {"session.tracing": "auto"}
        return
    assert update.instructions == "Answer briefly." and [tool["name"] for tool in update.tools] == ["get_weather"]
    assert update.turn_detection.kind == "semantic_vad" and update.turn_detection.vad_overrides() == {}
    assert update.transcription is True and update.input_rate == update.output_rate == 24000


def test_semantic_eagerness_maps_onto_the_vads_silence_and_null_means_manual_turns():
    def detection(node):
        return parse({"type": "session.update", "session": {"audio": {"input": {"turn_detection": node}}}}).turn_detection

    silences = {eagerness: detection({"type": "semantic_vad", "eagerness": eagerness}).vad_overrides()
                for eagerness in ("low", "medium", "high", "auto")}
    assert silences == {"low": {"min_silence_ms": 800}, "medium": {"min_silence_ms": 600},
                        "high": {"min_silence_ms": 400}, "auto": {}}
    manual = detection(None)
    assert manual.manual and manual.vad_overrides() == {}
    server = detection({"type": "server_vad", "threshold": 0.4, "silence_duration_ms": 300, "idle_timeout_ms": 6000})
    assert server.vad_overrides() == {"threshold": 0.4, "min_silence_ms": 300} and server.idle_timeout_ms == 6000


def test_keys_that_cannot_apply_are_accepted_and_noted():
    update = parse({"type": "session.update", "session": {
        "type": "realtime", "tracing": {"workflow_name": "w"}, "include": ["item.input_audio_transcription.logprobs"],
        "prompt": {"id": "pmpt_1"}, "max_output_tokens": "inf", "truncation": "auto", "parallel_tool_calls": True,
        "audio": {"input": {"noise_reduction": {"type": "near_field"},
                            "transcription": {"model": "whisper-1", "language": "en", "prompt": "s2s"}},
                  "output": {"voice": {"id": "voice_1234"}, "speed": 1.2}},
        "tool_choice": {"type": "function", "name": "get_weather"}}})
    assert set(update.acknowledged) == {"session.tracing", "session.include", "session.prompt",
                                        "session.truncation", "session.parallel_tool_calls",
                                        "session.audio.input.noise_reduction"}
    assert update.voice == "voice_1234" and update.speed == 1.2
    assert (update.max_output_tokens, update.transcription, update.transcription_language) == ("inf", True, "en")
    assert update.tool_choice == {"type": "function", "name": "get_weather"}


@pytest.mark.parametrize("session,param", [
    ({"voices": "x"}, "session.voices"),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 5}}}},
     "session.audio.input.turn_detection.threshold"),
    ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "wild"}}}},
     "session.audio.input.turn_detection.eagerness"),
    ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "threshold": 0.5}}}},
     "session.audio.input.turn_detection.threshold"),
    ({"audio": {"input": {"noise_reduction": {"type": "studio"}}}}, "session.audio.input.noise_reduction.type"),
    ({"audio": {"input": {"transcription": {"model": "m", "temperature": 0}}}},
     "session.audio.input.transcription.temperature"),
    ({"audio": {"output": {"speed": 3}}}, "session.audio.output.speed"),
    ({"audio": {"output": {"format": {"type": "audio/pcmu"}}}}, "session.audio.output.format.type"),
    ({"tool_choice": "required"}, "session.tool_choice"),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "session.tools[0].type"),
    ({"tracing": "always"}, "session.tracing"),
    ({"max_output_tokens": 0}, "session.max_output_tokens"),
    ({"audio": {"output": {"_target_": "os.system"}}}, "session.audio.output._target_"),
])
def test_a_key_outside_the_schema_or_a_bad_value_is_refused_by_its_param(session, param):
    with pytest.raises(ProtocolError) as refused:
        parse({"type": "session.update", "event_id": "evt_1", "session": session})
    assert refused.value.param == param and refused.value.event_id == "evt_1"


def test_response_create_carries_its_own_instructions_tools_and_conversation():
    def request(response):
        body = {"type": "response.create", "response": response}
        return parse_response_create(ClientEvent("response.create", None, body), LIMITS)

    out_of_band = request({"conversation": "none", "instructions": "Summarize.", "metadata": {"topic": "t"},
                           "output_modalities": ["audio"], "tool_choice": "none",
                           "input": [{"type": "message", "role": "user",
                                      "content": [{"type": "input_text", "text": "Sum it up."}]}]})
    assert out_of_band.out_of_band and out_of_band.instructions == "Summarize." and out_of_band.tool_choice == "none"
    assert [item.text for item in out_of_band.input] == ["Sum it up."] and out_of_band.metadata == {"topic": "t"}
    assert request({"tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"}}).tools[0]["name"] == \
        "get_weather"
    assert request({"output_modalities": ["text"]}).text_only and request({}).text_only is None
    own = request({"max_output_tokens": 20, "audio": {"output": {"voice": {"id": "verse"},
                                                                  "format": {"type": "audio/pcm", "rate": 16000}}}})
    assert (own.max_output_tokens, own.voice, own.output_rate) == (20, "verse", 16000)
    assert request({"max_output_tokens": "inf"}).max_output_tokens == "inf" and request({}).voice is None
    for bad, param in (({"conversation": "other"}, "response.conversation"),
                       ({"output_modalities": ["text", "audio"]}, "response.output_modalities"),
                       ({"output_modalities": []}, "response.output_modalities"),
                       ({"voice": "alloy"}, "response.voice"),  # the beta shape: GA has audio.output.voice
                       ({"max_output_tokens": 5000}, "response.max_output_tokens"),
                       ({"audio": {"output": {"speed": 1.2}}}, "response.audio.output.speed"),
                       ({"audio": {"output": {"format": {"type": "audio/pcmu"}}}},
                        "response.audio.output.format.type")):
        with pytest.raises(ProtocolError) as refused:
            request(bad)
        assert refused.value.param == param

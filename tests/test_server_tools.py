"""Tools a client declares reach the LLM; its call goes to the client, whose output continues the turn.

A real server whose LLM is the tiny tool-calling model the LLM tests build (overfitted to answer the weather
question with one get_weather call, and the call's result with a spoken reply), driven by the openai SDK.
"""
from __future__ import annotations

import json

import pytest

from realtime_server import Events, RunningServer, openai_client, reply_audio
from tests.fixtures import llm_models, weather_tools

pytest.importorskip("websockets")
pytest.importorskip("openai")

CACHE = llm_models.ROOT / ".cache" / "models"
TOOL = {"type": "function", **weather_tools.TOOLS[0]["function"]}  # the Realtime API's flat form


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = llm_models.tool_lm("native", CACHE)
    running = RunningServer(tmp_path_factory.mktemp("server"), "llm=ctranslate2", f"llm.model={model}",
                            "llm.max_new_tokens=48",
                            # the tiny model's margin is trained in float32: int8 on an AVX2 EPYC (oneDNN) turned
                            # its follow-up into "citycall>"; this test is about the protocol, not quantisation
                            "llm.compute_type=float32",
                            "server.max_sessions=1", "runner.warm_up=false", env={"S2S_API_KEY": ""})
    yield running
    assert running.stop() == 0, running.output[-3000:]


def test_a_tool_call_goes_to_the_client_and_its_output_continues_the_turn(server):
    with openai_client(server, "unused").realtime.connect(model="s2s") as connection:
        events = Events(connection)
        events.until("session.created", 60)
        connection.session.update(session={"type": "realtime", "instructions": "", "tools": [TOOL]})
        assert events.until("session.updated", 30).session.tools[0].name == "get_weather"
        connection.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": weather_tools.QUESTION}]})
        connection.response.create()
        first = events.until("response.created", 60)
        call = events.until("response.function_call_arguments.done", 120)
        assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
        assert call.response_id == first.response.id
        done = events.until("response.done", 60)
        assert done.response.id == first.response.id and done.response.status == "completed"
        assert [item.type for item in done.response.output][-1] == "function_call"

        connection.conversation.item.create(item={"type": "function_call_output", "call_id": call.call_id,
                                                  "output": weather_tools.RESULT})
        connection.response.create()
        second = events.until("response.created", 60)
        assert second.response.id != first.response.id
        finished = events.until("response.done", 180)
        assert finished.response.id == second.response.id and finished.response.status == "completed"
        said = events.of("response.output_audio_transcript.done")[-1].transcript
        assert "sunny" in said.lower()
        assert len(reply_audio(events.all, second.response.id)) > 24000 * 0.5
        session_id = events.of("session.created")[0].session.id
    # each response has the tokens of its own round: the call's, then the follow-up's (its prompt holds the call)
    calling, following = done.response.usage, finished.response.usage
    assert 0 < calling.input_tokens < following.input_tokens and calling.output_tokens > 0
    assert following.total_tokens == following.input_tokens + following.output_tokens
    server.wait_idle()
    [session] = [s for s in server.get("/v1/sessions")[1]["sessions"] if s["id"] == session_id]
    assert session["usage"] == {"total_tokens": calling.total_tokens + following.total_tokens,
                                "input_tokens": calling.input_tokens + following.input_tokens,
                                "output_tokens": calling.output_tokens + following.output_tokens,
                                "cached_tokens": 0}  # CTranslate2 says; no system prompt to cache


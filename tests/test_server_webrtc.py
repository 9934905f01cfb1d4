"""WebRTC calls (``POST /v1/realtime/calls``) from an aiortc client against a real server (``llm=echo``).

The client (:mod:`s2s.rtc_client`) offers an Opus microphone track and the ``oai-events`` data channel, as a
browser does, speaks espeak-ng questions at the pace of speech and records the reply audio it hears. Each test
is bounded (about a minute at most) and shares the session-wide echo server with the official clients' tests.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from realtime_server import API_KEY
from s2s import audio

pytest.importorskip("aiortc", reason="the webrtc extra (aiortc) is needed for WebRTC calls")
from s2s.rtc_client import RATE, RtcCall  # noqa: E402  (after the skip: it imports aiortc)

LONG = ("Please tell me a long story about a small brown dog, a tall green tree, a quiet old house, "
        "and a river that runs far away to the sea.")


@pytest.fixture(scope="module")
def voice(espeak, tmp_path_factory):
    folder = tmp_path_factory.mktemp("voice")

    def say(name: str, text: str) -> np.ndarray:
        return audio.read_audio(espeak(text, folder / f"{name}.wav"), RATE)

    return {"question": say("question", "What is the capital of France?"), "long": say("long", LONG),
            "short": say("short", "Wait, stop there please.")}


def call(server, scenario, timeout_s: float = 60):
    """Run ``scenario(call)`` on a fresh call (bounded), then close it; returns what the scenario returned."""
    server.wait_idle()  # one session at a time: the previous test's may still be closing

    async def run():
        rtc = RtcCall(server.http, API_KEY)
        try:
            await rtc.start()
            return await scenario(rtc)
        finally:
            await rtc.close()

    return asyncio.run(asyncio.wait_for(run(), timeout_s))


def test_audio_goes_both_ways_and_no_audio_rides_the_data_channel(echo_server, voice):
    async def scenario(rtc):
        rtc.say(voice["question"], RATE)
        await rtc.until("output_audio_buffer.stopped", 45)
        return rtc

    rtc = call(echo_server, scenario)
    kinds = [event["type"] for event in rtc.events]
    assert kinds[0] == "session.created"
    heard = rtc.of("conversation.item.input_audio_transcription.completed")[0]["transcript"].lower()
    assert "capital" in heard, heard  # "France" is marginal for tiny.en int8 on some CPUs ("and friends" in CI)
    said = rtc.of("response.output_audio_transcript.done")[0]["transcript"]
    assert "capital" in said.lower(), said  # llm=echo says the question back
    assert "response.output_audio.delta" not in kinds and "error" not in kinds, kinds
    started, stopped = kinds.index("output_audio_buffer.started"), kinds.index("output_audio_buffer.stopped")
    assert kinds.index("response.created") < started < stopped
    # the reply came as sound on the track: about as long as the echo of a two-second question
    assert rtc.sound_s() > 0.8, rtc.sound_s()
    _, sessions = echo_server.get("/v1/sessions")
    assert sessions["sessions"][-1]["turns"][0]["timings"]["voice_to_voice_s"] < 5


def test_speaking_over_the_reply_cuts_its_audio_and_truncates_it_to_what_was_heard(echo_server, voice):
    async def scenario(rtc):
        rtc.say(voice["long"], RATE)
        started = await rtc.until("output_audio_buffer.started", 45)
        await asyncio.sleep(2.0)  # the user listens to two seconds of the story, then speaks over it
        rtc.say(voice["short"], RATE)
        cleared = await rtc.until("output_audio_buffer.cleared", 20)
        truncated = await rtc.until("conversation.item.truncated", 10)
        await rtc.until("output_audio_buffer.started", 30, where=lambda e: e["response_id"] != started["response_id"])
        return rtc, started, cleared, truncated

    rtc, started, cleared, truncated = call(echo_server, scenario)
    assert cleared["response_id"] == started["response_id"]
    # the story's audio was made faster than it plays, so its response may be done: the cut is the playback's
    story = next(e for e in rtc.of("response.done") if e["response"]["id"] == started["response_id"])
    assert truncated["item_id"] == story["response"]["output"][0]["id"]
    assert 1500 <= truncated["audio_end_ms"] <= 6000, truncated  # what had played when the user spoke
    # the story stopped at once: nothing audible from a quarter second after the cut to the next reply
    second = rtc.of("output_audio_buffer.started")[-1]
    assert rtc.sound_s(rtc.arrival(cleared) + 0.25, rtc.arrival(second)) == 0.0
    _, sessions = echo_server.get("/v1/sessions")
    history = [m["content"] for m in sessions["sessions"][-1]["history"] if m["role"] == "assistant"]
    assert history and len(history[0].split()) < len(LONG.split()), history  # it keeps only what was heard


def test_hanging_up_ends_the_session_and_frees_its_pipeline(echo_server):
    async def scenario(rtc):
        assert await rtc.hang_up() == 204
        for _ in range(100):  # bounded: 10 s
            if rtc.channel.readyState == "closed" or not echo_server.get("/v1/sessions")[1]["active"]:
                break
            await asyncio.sleep(0.1)
        return await rtc.hang_up()

    assert call(echo_server, scenario) == 404  # the call is gone
    echo_server.wait_idle()
    _, sessions = echo_server.get("/v1/sessions")
    assert sessions["active"] == 0 and sessions["sessions"][-1]["status"] == "hung_up"

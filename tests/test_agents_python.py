"""The official openai-agents client (PyPI) against real servers: a RealtimeRunner session over WebSocket.

The SDK validates every server event against the openai SDK's schema and reports a mismatch, a refused key or
an unknown event as an ``error`` event: each test asserts there was none.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from realtime_server import API_KEY, pcm16
from tests.fixtures import llm_models, weather_tools

pytest.importorskip("websockets")
agents = pytest.importorskip("agents")
realtime = pytest.importorskip("agents.realtime")
LONG = ("Please tell me a long story about a small brown dog, a tall green tree, a quiet old house, "
        "and a river that runs far away to the sea.")


class Run:
    """One RealtimeSession: the server's events, the SDK's errors, its tool calls and its last history."""

    def __init__(self) -> None:
        self.server_events: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.tool_calls: list[str] = []
        self.history: list[Any] = []
        self.changed = asyncio.Event()

    def types(self) -> list[str]:
        return [event["type"] for event in self.server_events]

    def done(self) -> list[dict[str, Any]]:
        return [e["response"] for e in self.server_events if e["type"] == "response.done"
                and e["response"]["status"] == "completed"]

    def said(self) -> list[str]:
        texts = [part.get("transcript") for response in self.done() for item in response["output"]
                 if item["type"] == "message" for part in item["content"]]
        return [text for text in texts if text]

    async def until(self, test, timeout: float) -> None:
        async def wait() -> None:
            while not test():
                self.changed.clear()
                await self.changed.wait()
        try:
            await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"timed out; events so far: {self.types()[-30:]}, errors: {self.errors}") from None


def session_of(server, instructions: str, run: Run):
    from agents import function_tool
    from agents.realtime import RealtimeAgent, RealtimeRunner

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        run.tool_calls.append(city)
        return weather_tools.RESULT

    agent = RealtimeAgent(name="Assistant", instructions=instructions, tools=[get_weather])
    return RealtimeRunner(agent).run(model_config={"url": server.url, "api_key": API_KEY})


async def listen(session, run: Run) -> None:
    async for event in session:
        if event.type == "raw_model_event" and event.data.type == "raw_server_event":
            run.server_events.append(event.data.data)
        elif event.type == "error":
            run.errors.append(str(event.error)[:500])
        elif event.type == "history_updated":
            run.history = list(event.history)
        run.changed.set()


async def converse(server, instructions: str, script, timeout: float = 150) -> Run:
    run = Run()
    server.wait_idle()  # one session at a time: the previous test's may still be closing
    session = await session_of(server, instructions, run)
    async with session:
        reader = asyncio.create_task(listen(session, run))
        try:
            await asyncio.wait_for(script(session, run), timeout)
            await asyncio.sleep(0.5)  # the SDK's own retrieve after the last event
        finally:
            reader.cancel()
    assert run.errors == [], run.errors
    return run


def chunks(samples, seconds: float = 0.1):
    step = int(24000 * seconds)
    return [samples[start:start + step].tobytes() for start in range(0, len(samples), step)]


@pytest.fixture(scope="module")
def speech(tmp_path_factory, espeak):
    folder = tmp_path_factory.mktemp("speech")
    return {name: pcm16(espeak(text, folder / f"{name}.wav")) for name, text in (
        ("question", "What is the weather in Paris?"), ("long", LONG),
        ("short", "The quick brown fox jumps over the lazy dog."))}


def test_a_spoken_question_gets_a_spoken_reply_and_no_error(echo_server, speech):
    async def script(session, run):
        for block in chunks(speech["question"]):
            await session.send_audio(block)
        await run.until(lambda: run.said(), 120)

    run = asyncio.run(converse(echo_server, "Be brief.", script))
    audio = sum(len(e["delta"]) * 3 // 4 for e in run.server_events if e["type"] == "response.output_audio.delta")
    assert audio > 2 * 24000 * 0.5
    heard = [e["transcript"] for e in run.server_events
             if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert heard and "weather" in heard[0].lower()
    updated = [e["session"] for e in run.server_events if e["type"] == "session.updated"]
    assert updated[0]["instructions"] == "Be brief."
    assert updated[0]["audio"]["output"]["voice"] is None  # 'ash', the SDK's default, keeps piper's one voice
    assert updated[0]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"


def test_the_agents_instructions_are_in_force(agent_server):
    async def script(session, run):
        await session.send_message(weather_tools.CAPITAL)
        await run.until(lambda: run.said(), 120)

    run = asyncio.run(converse(agent_server, llm_models.INSTRUCTIONS, script))
    assert run.said() == [llm_models.INSTRUCTED_REPLY]  # the tiny LM says this only with the instructions


def test_a_tool_declared_in_the_sdk_is_called_and_its_result_spoken(agent_server):
    async def script(session, run):
        await session.send_message(weather_tools.QUESTION)
        await run.until(lambda: run.tool_calls and run.said(), 150)

    run = asyncio.run(converse(agent_server, llm_models.INSTRUCTIONS, script))
    assert run.tool_calls == ["Paris"] and run.said()[-1] == weather_tools.FOLLOW_UP
    assert [item.type for item in run.history].count("function_call") == 1


def test_an_interruption_truncates_the_reply_in_the_history(echo_server, speech):
    async def script(session, run):
        for block in chunks(speech["long"]):
            await session.send_audio(block)
        await run.until(lambda: "response.output_audio.delta" in run.types(), 120)
        await asyncio.sleep(1.5)  # the user listens a while, then talks over the reply
        for block in chunks(speech["short"]):
            await session.send_audio(block)
        await run.until(lambda: "conversation.item.truncated" in run.types() and run.said(), 120)

    run = asyncio.run(converse(echo_server, "", script))
    truncated = [e for e in run.server_events if e["type"] == "conversation.item.truncated"][0]
    assert truncated["audio_end_ms"] >= 1500
    retrieved = [e["item"] for e in run.server_events if e["type"] == "conversation.item.retrieved"
                 and e["item"]["id"] == truncated["item_id"]]
    cut = retrieved[-1]["content"][0]["transcript"]
    heard = [e["transcript"] for e in run.server_events
             if e["type"] == "conversation.item.input_audio_transcription.completed"][0]
    assert cut and len(cut.split()) < len(heard.split()), (cut, heard)
    _, sessions = echo_server.get("/v1/sessions")
    said = [m["content"] for m in sessions["sessions"][-1]["history"] if m["role"] == "assistant"]
    assert said[0] == cut, json.dumps(sessions["sessions"][-1]["history"])

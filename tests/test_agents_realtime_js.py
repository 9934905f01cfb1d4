"""The official @openai/agents-realtime client (npm) against real servers: a RealtimeSession, WebSocket transport.

tests/agents_realtime_client.js drives the library; its npm packages are installed from tests/package.json and
tests/package-lock.json into .cache/agents-js (``npm ci``, as scripts/setup.sh test does). Without node or npm the
tests skip. Each asserts that the SDK reported no error at all: no refused key, no unknown event.
"""
from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from realtime_server import API_KEY, ROOT, pcm16
from tests.fixtures import llm_models, weather_tools

pytest.importorskip("websockets")
MODULES = ROOT / ".cache" / "agents-js"
SCRIPT = ROOT / "tests" / "agents_realtime_client.js"
LONG = ("Please tell me a long story about a small brown dog, a tall green tree, a quiet old house, "
        "and a river that runs far away to the sea.")


@pytest.fixture(scope="module")
def node() -> str:
    """node, with @openai/agents-realtime installed from the checked-in lock file (once per lock file)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the @openai/agents-realtime tests")
    lock = ROOT / "tests" / "package-lock.json"
    installed = MODULES / "package-lock.json"
    if not (MODULES / "node_modules" / "@openai" / "agents-realtime").is_dir() or not installed.is_file() \
            or not filecmp.cmp(lock, installed, shallow=False):
        MODULES.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(ROOT / "tests" / name, MODULES / name)
        result = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=MODULES, capture_output=True,
                                text=True, timeout=600)
        if result.returncode != 0:
            pytest.skip(f"npm ci could not install @openai/agents-realtime: {result.stderr[-800:]}")
    return node


@pytest.fixture(scope="module")
def speech(tmp_path_factory, espeak):
    folder = tmp_path_factory.mktemp("speech")

    def raw(name: str, text: str) -> str:
        path = folder / f"{name}.pcm"
        path.write_bytes(pcm16(espeak(text, folder / f"{name}.wav")).tobytes())
        return str(path)

    return {"question": raw("question", "What is the weather in Paris?"), "long": raw("long", LONG),
            "short": raw("short", "The quick brown fox jumps over the lazy dog.")}


def drive(node: str, server, scenario: str, timeout_s: float = 150, **plan) -> dict:
    plan = {"url": server.url, "apiKey": API_KEY, "scenario": scenario, "instructions": "",
            "result": weather_tools.RESULT, "timeoutMs": int(timeout_s * 1000), **plan}
    env = {"NODE_PATH": str(MODULES / "node_modules"), "PATH": str(Path(node).parent)}
    server.wait_idle()  # one session at a time: the previous test's may still be closing
    result = subprocess.run([node, str(SCRIPT), json.dumps(plan)], capture_output=True, text=True,
                            timeout=timeout_s + 30, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert not report["timedOut"], (report["events"][-30:], report["errors"], server.output[-2000:])
    assert report["errors"] == [], report["errors"]
    return report


def test_a_spoken_question_gets_a_spoken_reply_and_no_error(node, echo_server, speech):
    report = drive(node, echo_server, "speak", speech=speech["question"], instructions="Be brief.")
    assert report["audioBytes"] > 2 * 24000 * 0.5  # over half a second of PCM16 reply
    assert report["userTranscripts"] and "weather" in report["userTranscripts"][0].lower()
    assert "conversation.item.retrieved" in report["events"]  # the SDK asked for the item after its transcript
    user = [item for item in report["history"] if item["role"] == "user"]
    assert user and user[0]["text"] == report["userTranscripts"][0]  # its history has what the server heard


def test_the_agents_instructions_are_in_force(node, agent_server):
    report = drive(node, agent_server, "ask", question=weather_tools.CAPITAL, instructions=llm_models.INSTRUCTIONS)
    # the tiny LM says this only with the agent's instructions as its system prompt (without: CAPITAL_REPLY)
    assert report["transcripts"] == [llm_models.INSTRUCTED_REPLY]
    assert report["audioBytes"] > 2 * 24000 * 0.5


def test_a_tool_declared_in_the_sdk_is_called_and_its_result_spoken(node, agent_server):
    report = drive(node, agent_server, "ask", question=weather_tools.QUESTION, instructions=llm_models.INSTRUCTIONS,
                   expectTool=True)
    assert report["toolCalls"] == ["Paris"]
    assert report["transcripts"][-1] == weather_tools.FOLLOW_UP
    calls = [item for item in report["history"] if item["type"] == "function_call"]
    assert [call["name"] for call in calls] == ["get_weather"]


def test_a_turn_resumed_after_a_cut_pause_leaves_one_question_and_its_answer_in_the_history(node, echo_server,
                                                                                           espeak, tmp_path):
    """The server deletes the cut turn's items (vad.resume_ms); the SDK drops them from its history, which ends with
    the whole sentence and the echo's reply to it. The SDK sends the audio at once, so the cut turn may be resumed
    before its words or its reply came: then only its question's item was announced, and goes."""
    import numpy as np

    from s2s import audio

    first, second = (audio.read_audio(espeak(text, tmp_path / f"{index}.wav"), 24000)
                     for index, text in enumerate(["Please tell me a long story about", "a small brown dog."]))
    path = tmp_path / "paused.pcm"
    path.write_bytes(audio.float_to_int16(np.concatenate([first, audio.silence(1.2, 24000), second,
                                                          audio.silence(2.0, 24000)])).tobytes())
    report = drive(node, echo_server, "resume", speech=str(path),
                   turnDetection={"type": "server_vad", "silenceDurationMs": 500})
    added = [index for index, kind in enumerate(report["events"]) if kind == "conversation.item.added"]
    assert 1 <= len(report["deleted"]) <= 2 and report["events"].index("conversation.item.deleted") > added[0]
    assert "dog" in report["userTranscripts"][-1].lower() and "story" in report["userTranscripts"][-1].lower()
    users = [item for item in report["history"] if item["role"] == "user"]
    assistants = [item for item in report["history"] if item["role"] == "assistant"]
    assert len(users) == 1 and {"story", "dog"} <= set(users[0]["text"].lower().replace(".", " ").split())
    assert len(assistants) == 1 and "dog" in assistants[0]["text"].lower()


def test_an_interruption_truncates_the_reply_in_the_history(node, echo_server, speech):
    report = drive(node, echo_server, "interrupt", speech=speech["long"], interruption=speech["short"],
                   listenMs=1500)
    assert report["truncated"] and report["truncated"][0] >= 1500
    assert "response.done" in report["events"]
    assistant = [item for item in report["history"] if item["role"] == "assistant"]
    cut = assistant[0]["text"]
    heard_long = report["userTranscripts"][0]
    assert cut and len(cut.split()) < len(heard_long.split()), (cut, heard_long)  # only what was heard
    _, sessions = echo_server.get("/v1/sessions")
    history = sessions["sessions"][-1]["history"]
    said = [message["content"] for message in history if message["role"] == "assistant"]
    assert said[0] == cut  # the LLM's history keeps what the client kept

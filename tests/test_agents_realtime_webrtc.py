"""@openai/agents-realtime's WebRTC transport (``OpenAIRealtimeWebRTC``) in Debian's headless chromium.

The package's UMD bundle (installed by ``npm ci`` from tests/package-lock.json, as the WebSocket tests do) runs in
a page of the server's own origin; tests/agents_realtime_webrtc.js drives a RealtimeSession with it. The fake
microphone asks a question, asks for a long story and speaks over it, then says something long whose reply the
SDK's own ``interrupt()`` cuts. The key is a client secret (``ek_...``): in a browser the SDK refuses any other.
"""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile

from browser import Chromium, find_chromium
from realtime_server import API_KEY
from test_agents_realtime_js import MODULES, node  # noqa: F401  (the fixture installs the npm packages)

pytest.importorskip("aiortc", reason="the webrtc extra (aiortc) is needed for WebRTC calls")
pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parent / "agents_realtime_webrtc.js"
BUNDLE = MODULES / "node_modules" / "@openai" / "agents-realtime" / "dist" / "bundle" / "openai-realtime-agents.umd.js"
LINES = (("What is the capital of France?", 5.0),
         ("Please tell me a long story about a small brown dog, a tall green tree, a quiet old house, and a river "
          "that runs far away to the sea.", 3.0),
         ("Wait, stop there please, and tell me instead about the tall green tree near the quiet old house.", 12.0))


@pytest.fixture(scope="module")
def chromium():
    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium is not installed (apt-get install chromium; scripts/setup.sh test does it)")
    return binary


@pytest.fixture(scope="module")
def microphone(espeak, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("rtc-microphone")
    parts, rate = [], 22050
    for index, (text, silence_s) in enumerate(LINES):
        samples, rate = soundfile.read(espeak(text, folder / f"line{index}.wav"), dtype="float32")
        parts += [np.zeros(int(rate * 1.0), np.float32), samples, np.zeros(int(rate * silence_s), np.float32)]
    path = folder / "microphone.wav"
    soundfile.write(path, np.concatenate(parts), rate, subtype="PCM_16")
    return path


def client_secret(server) -> str:
    body = json.dumps({"expires_after": {"anchor": "created_at", "seconds": 60}}).encode()
    request = urllib.request.Request(f"{server.http}/v1/realtime/client_secrets", method="POST", data=body,
                                     headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["value"]


def until(page, expression: str, timeout_s: float) -> None:
    """Poll ``expression`` in the page; on the deadline fail with the report so far."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            report = page.evaluate("window.rtcReport")
            raise AssertionError(f"{expression} did not hold within {timeout_s} s: {report}")
        time.sleep(0.25)


def test_a_browser_talks_to_the_server_over_webrtc_with_the_agents_sdk(
        node, chromium, microphone, echo_server, tmp_path):  # noqa: F811  (node: the imported fixture)
    assert BUNDLE.is_file(), f"no {BUNDLE}: npm ci did not install @openai/agents-realtime"
    echo_server.wait_idle()
    browser = Chromium(chromium, tmp_path / "profile", microphone)
    try:
        page = browser.page()
        page.call("Page.enable")
        page.call("Page.navigate", {"url": f"{echo_server.http}/health"})  # the server's origin: same-origin calls
        page.wait_for("document.readyState === 'complete'", 30)
        page.evaluate(BUNDLE.read_text(), timeout=60)
        page.evaluate(SCRIPT.read_text())
        plan = {"url": f"{echo_server.http}/v1/realtime/calls", "apiKey": client_secret(echo_server),
                "instructions": "Be brief."}
        page.evaluate(f"window.runRtc({json.dumps(plan)})", timeout=40)
        until(page, "window.rtcReport.interrupted && window.rtcReport.cleared.length >= 2", 75)
        until(page, "window.rtcReport.truncated.length >= 2", 10)
        page.evaluate("window.rtcFinish()", timeout=20)
        report = page.evaluate("window.rtcReport")
    finally:
        browser.close()
    assert report["errors"] == [], report["errors"]
    heard = [text.lower() for text in report["userTranscripts"]]
    assert len(heard) >= 3 and "capital" in heard[0] and "story" in heard[1] and "house" in heard[2], heard
    assert "capital" in report["transcripts"][0]["text"].lower(), report["transcripts"]  # llm=echo says it back
    # audio both ways, as Opus: the microphone went out, the replies came in with sound in them
    stats = report["stats"]
    assert "audio/opus" in stats["codecs"], stats
    assert stats["outbound"]["packets"] > 30 * 50, stats  # over 30 s of 20 ms packets from the microphone
    assert stats["inbound"]["packets"] > 10 * 50 and stats["inbound"]["energy"] > 0.01, stats
    # the story was cut by the user's voice, the last reply by the SDK's interrupt(); each item was truncated
    story = report["started"][1]
    assert report["cleared"][0] == story and report["cleared"][-1] == report["interrupted"], report
    assert report["truncated"][0] > 1000 and report["truncated"][-1] > 0, report["truncated"]
    assert "response.output_audio.delta" not in report["events"]
    assistant = [item["text"] for item in report["history"] if item["role"] == "assistant"]
    assert len(assistant) >= 3 and len(assistant[1].split()) < len(LINES[1][0].split()), assistant

"""The browser page at ``GET /``, in Debian's headless chromium against a real server (``llm=echo``, an API key).

The fake microphone plays two espeak-ng questions once; the page must show what it heard and what it answered,
play the reply and give each turn's voice-to-voice figure. A wrong key, a full server, a refused microphone and a
dropped connection must each get their own message. Skipped without chromium (``apt-get install chromium``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile

from browser import Chromium, find_chromium
from realtime_server import API_KEY, RunningServer

pytest.importorskip("websockets")
pytestmark = pytest.mark.slow

QUESTIONS = (("What is the capital of France?", "capital"), ("How far away is the moon?", "moon"))
LONG = ("Please tell me a long story about a small brown dog, a tall green tree, a quiet old house, "
        "and a river that runs far away to the sea.")
SHOT_ENV = "S2S_PAGE_SCREENSHOT"  # where the conversation test also saves its screenshot (docs/page.png)


@pytest.fixture(scope="module")
def chromium():
    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium is not installed (apt-get install chromium; scripts/setup.sh test does it)")
    return binary


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = RunningServer(tmp_path_factory.mktemp("page-server"), "llm=echo", "llm.prefix='You said:'",
                            "server.max_sessions=1", env={"S2S_API_KEY": API_KEY})
    yield running
    assert running.stop() == 0, running.output[-3000:]


def speech_file(espeak, folder: Path, lines: list[tuple[str, float]]) -> Path:
    """Each text after silence and followed by its own: a 16-bit WAV for chromium's fake microphone.

    The first text waits 3 s: the fake microphone starts when the page asks for it, and a WebRTC call on a busy
    machine connected after the first second, so the server heard only the end of the first question (CI, twice).
    """
    parts, rate = [], 22050
    for index, (text, silence_s) in enumerate(lines):
        samples, rate = soundfile.read(espeak(text, folder / f"line{index}.wav"), dtype="float32")
        lead_s = 3.0 if index == 0 else 1.0
        parts += [np.zeros(int(rate * lead_s), np.float32), samples, np.zeros(int(rate * silence_s), np.float32)]
    path = folder / "microphone.wav"
    soundfile.write(path, np.concatenate(parts), rate, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def microphone(tmp_path_factory, espeak) -> Path:
    """Both questions, with room for each reply."""
    return speech_file(espeak, tmp_path_factory.mktemp("microphone"), [(text, 5.0) for text, _ in QUESTIONS])


@pytest.fixture
def browser(chromium, microphone, tmp_path):
    running = Chromium(chromium, tmp_path / "profile", microphone)
    yield running
    running.close()


def heard_and_echoed(users: list[str], replies: list[str]) -> None:
    """Each question became a user line and its echo. The words are Whisper tiny.en's on espeak through the browser
    (and Opus): one may flip ("How far away is the moon?" was once heard as "I'll run days and I'll move."), so the
    key words are asked of the two turns together, not of each."""
    assert all(heard.strip() for heard in users), users
    for heard, reply in zip(users, replies):
        assert reply.startswith("You said:") and heard.strip(" .?!") in reply.lower(), (users, replies)
    assert any(word in heard for (_, word), heard in zip(QUESTIONS, users)), users


def wait_until_free(server, timeout: float = 30) -> None:
    """The previous test's session has given its pipeline back (max_sessions=1)."""
    deadline = time.monotonic() + timeout
    while server.get("/v1/sessions")[1].get("active"):
        assert time.monotonic() < deadline, "the previous session did not end"
        time.sleep(0.2)


def open_page(browser, server, key: str | None = None, size: tuple[int, int] = (1100, 760),
              transport: str = "websocket"):
    """The page, its Start pressed; with ``key``, as if the user had ticked 'keep it in this tab' earlier.

    ``transport``: the page calls over WebRTC by default; ``websocket`` opens it as ``/?transport=websocket``.
    """
    page = browser.page(*size)
    url = server.http + ("/?transport=websocket" if transport == "websocket" else "/")
    page.open(url)
    if key is not None:
        page.evaluate(f"sessionStorage.setItem('s2s.apiKey', {json.dumps(key)})")
        page.open(url)
    page.click("#start")
    return page


def enter_key(page, key: str) -> None:
    page.wait_for("window.s2sStats.message === 'key-needed'", 30)
    assert not page.evaluate("document.getElementById('key-form').hidden")
    page.type_into("#key", key)
    page.click("#connect")


def test_the_page_is_public_and_a_browser_may_offer_the_key_as_a_subprotocol(server):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    with urllib.request.urlopen(server.http + "/", timeout=10) as response:
        html = response.read().decode()
        assert response.headers["Content-Type"].startswith("text/html")
    assert "/page/app.js" in html and API_KEY not in html
    for name in ("app.js", "audio-worklet.js", "style.css"):
        with urllib.request.urlopen(f"{server.http}/page/{name}", timeout=10) as response:
            assert response.status == 200 and API_KEY.encode() not in response.read()
    assert server.get("/page/nothing.js", api_key=None)[0] == 401  # not a page file: the key rules apply
    assert server.get("/v1/sessions", api_key=None)[0] == 401
    wait_until_free(server)
    with connect(server.url, subprotocols=["realtime", f"openai-insecure-api-key.{API_KEY}"],
                 open_timeout=20) as connection:
        assert connection.subprotocol == "realtime"  # the key is never echoed back
        assert json.loads(connection.recv(timeout=20))["type"] == "session.created"
    with pytest.raises(InvalidStatus) as refused:
        with connect(server.url, subprotocols=["realtime", "openai-insecure-api-key.wrong-key"], open_timeout=20):
            pass
    assert refused.value.response.status_code == 401


def test_a_spoken_conversation_shows_both_sides_plays_the_reply_and_times_each_turn(server, browser, tmp_path):
    wait_until_free(server)
    page = open_page(browser, server, size=(960, 540))  # the size of the screenshot in the README
    enter_key(page, API_KEY)
    page.wait_for("window.s2sStats.state === 'listening' || window.s2sStats.state === 'speaking'", 30)
    page.wait_for("window.s2sStats.voiceToVoiceMs.length >= 2", 90)
    shot = page.screenshot(tmp_path / "page.png")  # the second reply is playing
    if os.environ.get(SHOT_ENV):
        shutil.copyfile(shot, os.environ[SHOT_ENV])
    page.wait_for("window.s2sStats.state === 'listening'", 30)  # the second reply has played out
    state = page.state()["stats"]
    users = [line["text"].lower() for line in state["transcript"] if line["role"] == "user"]
    replies = [line["text"] for line in state["transcript"] if line["role"] == "assistant"]
    assert len(users) == len(replies) == 2, state["transcript"]
    heard_and_echoed(users, replies)
    shown = [page.text(f"#transcript li:nth-child({n}) .text") for n in (1, 2, 3, 4)]
    assert [line["text"] for line in state["transcript"]] == shown
    # the page played (nearly) every sample it got, and those were whole replies of seconds
    assert state["receivedSamples"] > 2 * 1.0 * state["rate"]
    assert state["playedSamples"] >= state["receivedSamples"] - state["rate"] * 0.2
    assert re.fullmatch(r"\d+\.\d\d s", page.text("#stat-v2v")), page.text("#stat-v2v")
    assert "voice-to-voice" in page.text("#transcript li:nth-child(2) .meta")
    # the page's figure, on its own audio clock, tells the same story as the server's (its sink, input clock)
    _, document = server.get("/v1/sessions")
    figures = [turn["timings"]["voice_to_voice_s"] for turn in document["sessions"][-1]["turns"]]
    assert len(figures) == 2, document["sessions"][-1]
    for ours, theirs in zip(state["voiceToVoiceMs"], figures):
        assert theirs - 0.15 <= ours / 1000 <= theirs + 1.5, (state["voiceToVoiceMs"], figures)
    assert page.evaluate("sessionStorage.getItem('s2s.apiKey')") is None  # not kept: the box was not ticked


def test_speaking_over_the_reply_stops_it_at_once(server, chromium, espeak, tmp_path):
    # the long request's echo takes about 8 s to say; the user speaks again 3 s after asking
    voice = speech_file(espeak, tmp_path, [(LONG, 3.0), ("Wait, stop there please.", 5.0)])
    browser = Chromium(chromium, tmp_path / "profile", voice)
    try:
        wait_until_free(server)
        page = open_page(browser, server, key=API_KEY)
        page.wait_for("window.s2sStats.bargeIns >= 1", 90)
        page.wait_for("window.s2sStats.transcript.filter(line => line.role === 'user').length >= 2", 60)
        state = page.state()["stats"]
        first = next(line for line in state["transcript"] if line["role"] == "assistant")
        assert first["status"] in ("interrupted", "cancelled"), state["transcript"]
        assert "interrupted" in page.text(f'#transcript li[data-id="{first["id"]}"] .meta')
        # what was still queued when the user spoke was dropped, not played
        assert state["receivedSamples"] - state["playedSamples"] > state["rate"] * 1.0, state
    finally:
        browser.close()


def test_over_webrtc_a_conversation_shows_both_sides_plays_the_reply_and_times_each_turn(server, browser):
    pytest.importorskip("aiortc", reason="the server takes WebRTC calls with the webrtc extra (aiortc)")
    wait_until_free(server)
    page = open_page(browser, server, key=API_KEY, transport="webrtc")  # the page's default
    page.wait_for("window.s2sStats.voiceToVoiceMs.length >= 2", 90)
    page.wait_for("window.s2sStats.state === 'listening'", 30)
    state = page.state()["stats"]
    assert state["transport"] == "webrtc" and state["fallback"] is None, state
    users = [line["text"].lower() for line in state["transcript"] if line["role"] == "user"]
    replies = [line["text"] for line in state["transcript"] if line["role"] == "assistant"]
    assert len(users) == len(replies) == 2, state["transcript"]
    heard_and_echoed(users, replies)
    assert state["playedSamples"] > 2 * 1.0 * state["rate"]  # the replies' sound came over the track, seconds of it
    assert state["errors"] == [] and "voice-to-voice" in page.text("#transcript li:nth-child(2) .meta")
    # the page's figure (its loud microphone chunks to the reply's first loud block, one frame clock) tells the
    # server's story (its sink, input clock) plus what WebRTC adds: Opus both ways and the jitter buffer
    _, document = server.get("/v1/sessions")
    figures = [turn["timings"]["voice_to_voice_s"] for turn in document["sessions"][-1]["turns"]]
    for ours, theirs in zip(state["voiceToVoiceMs"], figures):
        assert theirs - 0.15 <= ours / 1000 <= theirs + 1.5, (state["voiceToVoiceMs"], figures)
    hang_up(page, server)


def hang_up(page, server) -> None:
    """Stop, as the user would: the call closes at once. (A browser that is killed instead leaves the server to
    find the call gone by ICE consent, about 30 s later.)"""
    page.click("#stop")
    wait_until_free(server)


def test_over_webrtc_speaking_over_the_reply_stops_it(server, chromium, espeak, tmp_path):
    pytest.importorskip("aiortc", reason="the server takes WebRTC calls with the webrtc extra (aiortc)")
    # the echo of the long request plays for about 8 s; speaking 4.5 s after asking lands in it even when a busy
    # machine starts the reply late
    voice = speech_file(espeak, tmp_path, [(LONG, 4.5), ("Wait, stop there please.", 5.0)])
    browser = Chromium(chromium, tmp_path / "profile", voice)
    try:
        wait_until_free(server)
        page = open_page(browser, server, key=API_KEY, transport="webrtc")
        page.wait_for("window.s2sStats.bargeIns >= 1", 90)  # the server cut the reply: output_audio_buffer.cleared
        page.wait_for("window.s2sStats.transcript.filter(line => line.role === 'user').length >= 2", 60)
        state = page.state()["stats"]
        # the reply whose sound the server cut (the VAD may have split the long request: an earlier reply to its
        # first part is then cancelled before it made a sound)
        cut = next(line for line in state["transcript"] if line["role"] == "assistant"
                   and line["status"] == "interrupted")
        assert state["transport"] == "webrtc", state
        assert "interrupted" in page.text(f'#transcript li[data-id="{cut["id"]}"] .meta')
        hang_up(page, server)
    finally:
        browser.close()


@pytest.mark.parametrize("transport", ["websocket", "webrtc"])
def test_a_wrong_key_says_so_and_asks_again(server, browser, transport):
    page = open_page(browser, server, transport=transport)
    enter_key(page, "not-the-key-000")
    page.wait_for("window.s2sStats.message === 'wrong-key'", 30)
    assert "refused this API key" in page.text("#message")
    assert not page.evaluate("document.getElementById('key-form').hidden")
    assert page.evaluate("window.s2sStats.state") == "key"


@pytest.mark.parametrize("transport", ["websocket", "webrtc"])
def test_a_full_server_says_so(server, browser, transport):
    from websockets.sync.client import connect

    wait_until_free(server)
    with connect(server.url, additional_headers={"Authorization": f"Bearer {API_KEY}"},
                 open_timeout=20) as holder:  # holds the only session
        assert json.loads(holder.recv(timeout=20))["type"] == "session.created"
        page = open_page(browser, server, key=API_KEY, transport=transport)
        page.wait_for("window.s2sStats.message === 'server-full'", 30)
        assert "server is full" in page.text("#message")
        assert "session_limit_reached" in page.evaluate("window.s2sStats.errors")
        page.wait_for("window.s2sStats.state === 'error'", 10)  # closed, and not called a dropped connection
        assert page.evaluate("window.s2sStats.message") == "server-full"


def test_a_refused_microphone_says_so(server, chromium, microphone, tmp_path):
    browser = Chromium(chromium, tmp_path / "profile", microphone, microphone=False)
    try:
        browser.deny_microphone(server.http)
        page = open_page(browser, server, key=API_KEY)
        page.wait_for("window.s2sStats.message === 'mic-refused'", 30)
        assert "Microphone access was refused" in page.text("#message")
        assert page.evaluate("window.s2sStats.sentChunks") == 0
    finally:
        browser.close()


@pytest.mark.parametrize("transport", ["websocket", "webrtc"])
def test_a_dropped_connection_says_so(browser, tmp_path, transport):
    doomed = RunningServer(tmp_path / "doomed", "llm=echo", "server.max_sessions=1", env={"S2S_API_KEY": API_KEY})
    try:
        page = open_page(browser, doomed, key=API_KEY, transport=transport)
        page.wait_for("window.s2sStats.state === 'listening'", 30)
        assert doomed.stop() == 0
        page.wait_for("window.s2sStats.message === 'dropped'", 30)
        assert "connection to the server dropped" in page.text("#message")
    finally:
        doomed.stop()

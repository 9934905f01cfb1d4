"""The server's HTTP endpoints with a body, against a real server (``llm=echo``, one session, an API key).

Each bad request to ``POST /v1/realtime/calls`` gets its own status and message and the server goes on; a call
that never connects is released after ``server.call_connect_timeout_s``; ``POST /v1/realtime/client_secrets``
mints a key for one session that carries its session config, over WebRTC and WebSocket, and the official
``openai`` SDK mints one, connects with it and calls with a multipart offer.
"""
from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from realtime_server import API_KEY, RunningServer

pytest.importorskip("websockets")
pytest.importorskip("aiortc", reason="the webrtc extra (aiortc) is needed for WebRTC calls")
from aiortc import RTCPeerConnection  # noqa: E402

from s2s.rtc_client import CallError, Microphone, RtcCall  # noqa: E402

CONNECT_S = 3  # server.call_connect_timeout_s here


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = RunningServer(tmp_path_factory.mktemp("calls"), "llm=echo", "server.max_sessions=1",
                            f"server.call_connect_timeout_s={CONNECT_S}", env={"S2S_API_KEY": API_KEY})
    yield running
    assert running.stop() == 0, running.output[-3000:]
    assert "Traceback" not in running.output, running.output[-3000:]  # refusals and released calls are no bugs


@pytest.fixture(scope="module")
def offer() -> str:
    """A browser-like offer (Opus microphone, the events channel) from a peer that never goes on with it."""
    async def make() -> str:
        pc = RTCPeerConnection()
        pc.addTrack(Microphone())
        pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return sdp

    return asyncio.run(make())


def post(server, path: str, body: bytes | None, kind: str | None = "application/sdp", key: str | None = API_KEY,
         method: str = "POST", headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(server.http + path, data=body, method=method, headers=headers or {})
    if kind:
        request.add_header("Content-Type", kind)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def error_of(body: bytes) -> tuple[str, str]:
    error = json.loads(body)["error"]
    return error["code"], error["message"]


def wait_released(server, status: str, timeout_s: float = 20) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, sessions = server.get("/v1/sessions")
        if not sessions["active"] and sessions["sessions"] and sessions["sessions"][-1]["status"] == status:
            return sessions
        time.sleep(0.2)
    raise AssertionError(f"no session ended {status} within {timeout_s} s: {server.get('/v1/sessions')[1]}")


NO_AUDIO = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"


@pytest.mark.parametrize("request_kwargs,status,code,words", [
    ({"key": None}, 401, "invalid_api_key", "missing, wrong or expired API key"),
    ({"key": "not-the-key-0000"}, 401, "invalid_api_key", "Bearer"),
    ({"kind": "application/json"}, 415, "unsupported_content_type", "application/sdp"),
    ({"body": b"v=0\r\nthis is not an offer\r\nm=audio"}, 400, "invalid_offer", "cannot be read"),
    ({"body": NO_AUDIO.encode()}, 400, "invalid_offer", "no audio"),
    ({"body": b"\xff\xfe not text"}, 400, "invalid_offer", "not UTF-8"),
    ({"body": b"x" * (65 << 10)}, 413, "body_too_large", "at most"),
    ({"headers": {"Origin": "http://evil.example"}}, 403, "origin_not_allowed", "may not use this server"),
    ({"method": "PUT"}, 405, "method_not_allowed", "takes POST"),
    ({"path": "/v1/realtime/calls/rtc_nothing", "method": "DELETE"}, 404, "call_not_found", "no call"),
    ({"path": "/v1/elsewhere"}, 404, "not_found", "no such endpoint"),
])
def test_each_bad_call_gets_its_own_status_and_message(server, offer, request_kwargs, status, code, words):
    kwargs = {"path": "/v1/realtime/calls", "body": offer.encode(), **request_kwargs}
    got, _, body = post(server, kwargs.pop("path"), kwargs.pop("body"), **kwargs)
    assert (got, error_of(body)[0]) == (status, code), body
    assert words in error_of(body)[1], body
    assert server.alive() and server.get("/health", api_key=None) == (200, {"status": "ok"})
    assert server.get("/v1/sessions")[1]["active"] == 0  # nothing was taken by the refused request
    assert "Traceback" not in server.output


@pytest.mark.parametrize("raw,status", [
    (b"POST /v1/realtime/calls HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
    (b"POST /v1/realtime/calls HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
    (b"POST nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"POST /v1/realtime/calls HTTP/1.1\r\n" + b"X-Filler: " + b"a" * (20 << 10) + b"\r\n", 431),
])
def test_the_front_refuses_what_is_not_a_readable_request(server, raw, status):
    """Before any endpoint: the head is read (bounded), a body needs a Content-Length; the server goes on."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(raw)
        answer = connection.makefile("rb").read()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:300]
    assert json.loads(body)["error"]["message"]
    assert server.get("/health", api_key=None) == (200, {"status": "ok"})


def test_a_full_server_refuses_with_503_and_a_call_that_never_connects_is_released(server, offer):
    server.wait_idle()
    status, headers, answer = post(server, "/v1/realtime/calls", offer.encode())
    assert status == 201 and headers["Content-Type"] == "application/sdp" and answer.startswith(b"v=0")
    assert headers["Location"].startswith("/v1/realtime/calls/rtc_")
    assert "a=rtpmap:" in answer.decode() and "opus/48000/2" in answer.decode().lower()
    status, headers, body = post(server, "/v1/realtime/calls", offer.encode())  # the only pipeline is taken
    assert (status, error_of(body)[0]) == (503, "session_limit_reached") and headers["Retry-After"] == "5"
    started = time.monotonic()
    wait_released(server, "never_connected", CONNECT_S + 15)  # the offering peer never connected
    assert time.monotonic() - started < CONNECT_S + 10
    assert post(server, headers.get("Location") or "/v1/realtime/calls/rtc_x", None, None, method="DELETE")[0] == 404


def mint(server, body: dict, key: str | None = API_KEY) -> tuple[int, dict]:
    status, _, answer = post(server, "/v1/realtime/client_secrets", json.dumps(body).encode(), "application/json",
                             key=key)
    return status, json.loads(answer)


def test_a_client_secret_opens_one_call_with_the_session_it_was_minted_with(server):
    assert mint(server, {}, key=None)[0] == 401  # only the key's holder mints
    assert mint(server, {"expires_after": {"anchor": "created_at", "seconds": 5}})[0] == 400
    status, refused = mint(server, {"session": {"type": "realtime", "voice_of_god": True}})
    assert status == 400 and refused["error"]["code"] == "unknown_parameter", refused
    status, secret = mint(server, {"expires_after": {"anchor": "created_at", "seconds": 60},
                                   "session": {"type": "realtime", "instructions": "Answer in one word."}})
    assert status == 200 and secret["value"].startswith("ek_") and API_KEY not in secret["value"]
    assert time.time() + 50 < secret["expires_at"] <= time.time() + 61
    server.wait_idle()

    async def use() -> list[dict]:
        rtc = RtcCall(server.http, secret["value"])
        try:
            await rtc.start()
            await rtc.until("session.updated", 10)
            return rtc.events
        finally:
            await rtc.close()

    # a secret opens a session and nothing else: it mints no secret (say, without its instructions), reads no sessions
    assert mint(server, {}, key=secret["value"])[0] == 401
    assert server.get("/v1/sessions", api_key=secret["value"])[0] == 401
    events = asyncio.run(asyncio.wait_for(use(), 40))
    assert [e["type"] for e in events][:2] == ["session.created", "session.updated"]
    assert events[1]["session"]["instructions"] == "Answer in one word."
    server.wait_idle()
    with pytest.raises(CallError) as used:  # a secret opens one session
        asyncio.run(asyncio.wait_for(use(), 40))
    assert used.value.status == 401


def test_the_openai_sdk_mints_a_secret_connects_with_it_and_calls_with_a_multipart_offer(server, offer):
    from openai import OpenAI

    from realtime_server import Events, openai_client

    secret = openai_client(server).realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 120},
        session={"type": "realtime", "instructions": "Be brief."})
    assert secret.value.startswith("ek_") and secret.expires_at > time.time()
    server.wait_idle()
    with OpenAI(base_url=f"{server.http}/v1", api_key=secret.value).realtime.connect(model="s2s") as connection:
        events = Events(connection)
        events.until("session.created", 30)
        assert events.until("session.updated", 30).session.instructions == "Be brief."
    server.wait_idle()
    answer = openai_client(server).realtime.calls.create(sdp=offer, session={"type": "realtime",
                                                                             "instructions": "Be terse."})
    assert answer.content.startswith(b"v=0") and b"opus/48000" in answer.content.lower()
    sessions = wait_released(server, "never_connected", CONNECT_S + 15)  # this offer's peer is gone
    assert sessions["sessions"][-1]["status"] == "never_connected"

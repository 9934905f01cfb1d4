"""Hostile clients against a real server (``llm=echo``): what they send is escaped, capped and rate-limited in
the log, and the server goes on serving."""
from __future__ import annotations

import json
import queue
import re
import threading
import time

import pytest

from realtime_server import API_KEY, RunningServer, open_websocket
from s2s.server.client_log import LINES_PER_MINUTE, QUOTE_CHARS, quote

pytest.importorskip("websockets")
BAD_FRAMES = 500
QUEUED = 128  # server.max_queued_events


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = RunningServer(tmp_path_factory.mktemp("hostile"), "llm=echo", "server.max_sessions=1",
                            f"server.max_queued_events={QUEUED}", env={"S2S_API_KEY": API_KEY})
    yield running
    assert running.stop() == 0, running.output[-3000:]


class Client:
    """A raw WebSocket client whose events are read in a thread (``events``), so sends never wait on reads."""

    def __init__(self, server: RunningServer, reading: bool = True) -> None:
        # max_queue: a client that does not read stops taking frames off its socket after this many
        self.connection = open_websocket(server.url, additional_headers={"Authorization": f"Bearer {API_KEY}"},
                                  max_size=None, max_queue=4)
        self.events: queue.Queue[dict | None] = queue.Queue()
        if reading:
            self.read()

    def read(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for frame in self.connection:
                self.events.put(json.loads(frame))
        except Exception:  # closed under us: the waits below see the end
            pass
        self.events.put(None)

    def until(self, kind: str, timeout: float = 120) -> dict:
        while (got := self.events.get(timeout=timeout)) is not None:
            if got["type"] == kind:
                return got
        raise AssertionError(f"the connection ended before {kind}")


def hostile(index: int) -> str | bytes:
    """Broken JSON, an unknown type full of NULs and line breaks, invalid UTF-8: each about 10 KB."""
    if index % 3 == 0:
        return "\x00{" + "A" * 10240
    if index % 3 == 1:
        return json.dumps({"type": "\x00evil\n" + "B" * 10240, "event_id": "\x00" * 100})  # errors echo ids
    return b"\x00\xff" * 5120


def test_quote_escapes_and_caps_what_a_client_sent():
    assert quote("a\x00b\n\u202e'") == "'a\\x00b\\n\\u202e''"
    long = quote("\x00" * 10240)
    assert "\x00" not in long and len(long) <= QUOTE_CHARS + 20 and long.endswith("…(10240 bytes)")
    assert quote(b"\xff" * 300).endswith("…(300 bytes)")


def test_a_flood_of_bad_frames_is_escaped_capped_and_counted_and_the_session_goes_on(server):
    client = Client(server)
    session_id = client.until("session.created", 60)["session"]["id"]
    for index in range(BAD_FRAMES):
        client.connection.send(hostile(index))
    errors = 0
    while errors < BAD_FRAMES:
        errors += client.until("error", 60)["type"] == "error"
    client.connection.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                                                             "instructions": "Be brief."}}))
    assert client.until("session.updated", 60)["session"]["instructions"] == "Be brief."
    client.connection.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there."}]}}))
    client.connection.send(json.dumps({"type": "response.create"}))
    assert client.until("response.done", 120)["response"]["status"] == "completed"
    client.connection.close()
    server.wait_idle()

    assert server.alive() and server.get("/health", api_key=None) == (200, {"status": "ok"})
    output = server.output
    assert "\x00" not in output
    assert max(map(len, output.splitlines())) <= 300
    ours = [line for line in output.splitlines() if f"session {session_id}: " in line]
    caused = [line for line in ours if re.search(r": (invalid_json|unknown_event_type): ", line)]
    assert 0 < len(caused) <= LINES_PER_MINUTE
    assert any("\\x00evil\\n" in line for line in caused)  # shown escaped, not dropped
    suppressed = [int(found.group(1)) for line in ours
                  if (found := re.search(r"(\d+) more log line\(s\) suppressed", line))]
    assert suppressed == [BAD_FRAMES - len(caused)]


def test_a_client_that_never_reads_is_dropped_with_an_error_and_a_close_code(server):
    from websockets.exceptions import ConnectionClosed

    server.wait_idle()
    client = Client(server, reading=False)
    big = json.dumps({"type": "no.such.event", "event_id": "x" * 60000})  # each error echoes its 60 KB id
    try:
        for _ in range(2000):  # far more than the socket's buffers and the outbox hold
            client.connection.send(big)
    except ConnectionClosed:  # the server gave up on us first
        pass
    deadline = time.monotonic() + 30
    while "(server.max_queued_events); dropping it" not in server.output and time.monotonic() < deadline:
        time.sleep(0.1)
    client.read()  # now take what was sent: the queued events, the error, the close
    last = None
    while (got := client.events.get(timeout=30)) is not None:
        last = got
    assert last is not None and last["type"] == "error" and last["error"]["code"] == "client_too_slow", last
    assert client.connection.close_code == 1008
    assert server.output.count("dropping it") == 1
    server.wait_idle()
    assert server.get("/health", api_key=None) == (200, {"status": "ok"})
    status, document = server.get("/v1/sessions")
    assert document["sessions"][-1]["status"] == "overflow"

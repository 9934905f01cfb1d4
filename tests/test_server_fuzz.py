"""A seeded protocol fuzz against a real server (``llm=echo``): several sessions at once send broken JSON, binary
frames, wrong types, huge and deeply nested payloads, bad base64, out-of-range numbers and unknown item ids,
while another client churns connections (open and close, vanish mid-frame, frames over the hard cap).

Every bad frame gets its ``error`` event (with a code it may have), a frame over the hard cap closes its
connection with 1009, the server stays up and healthy, its memory stays bounded, and afterwards a spoken
question still gets its spoken answer. Bounded: ``FRAMES`` frames over ``SESSIONS`` sessions, every wait has a
deadline and the fuzz itself must end within ``FUZZ_S``. ``S2S_FUZZ_SEED`` replays another seed.
"""
from __future__ import annotations

import base64
import json
import os
import random
import re
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from realtime_server import (API_KEY, Events, RunningServer, open_websocket, openai_client, pcm16, reply_audio,
                             send_speech)

pytest.importorskip("websockets")
pytest.importorskip("openai")

SEED = int(os.environ.get("S2S_FUZZ_SEED", "25"))
SESSIONS = 3
FRAMES = 300  # over all fuzzing sessions
CHURN = 30  # connections the churning client opens
FUZZ_S = 45.0  # the whole fuzz, sessions and churn together
WAIT_S = 10.0  # any one answer
MAX_FRAME = 1 << 20  # server.max_frame_bytes (its default)
HARD_CAP = 4 * MAX_FRAME  # s2s.server.handshake.FRAME_HARD_CAP: over this, close 1009
RSS_GROWTH_MB = 150
DEEP = 10000

JSONISH = ("invalid_json", "invalid_event", "unknown_event_type", "missing_required_parameter")
WRONG = ("invalid_type", "invalid_value", "missing_required_parameter", "unknown_parameter")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # one pipeline more than the fuzzing sessions: the churning client's
    running = RunningServer(tmp_path_factory.mktemp("fuzz"), "llm=echo", f"server.max_sessions={SESSIONS + 1}",
                            f"server.max_frame_bytes={MAX_FRAME}", env={"S2S_API_KEY": API_KEY})
    yield running
    assert running.stop() == 0, running.output[-3000:]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def log_records(output: str) -> list[str]:
    """The server's log, one record (a line with what follows it: a traceback) each."""
    return re.split(r"\n(?=\[\d{4}-\d\d-\d\d )", output)


# ---------------------------------------------------------------------------------------------- the frames
def _event(kind: str, **fields) -> str:
    return json.dumps({"type": kind, "event_id": f"evt_fuzz_{random.getrandbits(24):x}", **fields})


def _junk(rng: random.Random, size: int) -> str:
    return "".join(chr(rng.choice((rng.randrange(0, 0x80), rng.randrange(0x80, 0xD800)))) for _ in range(size))


def broken_json(rng: random.Random) -> tuple[str | bytes, tuple[str, ...]]:
    whole = _event("session.update", session={"type": "realtime", "instructions": "hi"})
    return rng.choice([
        whole[:rng.randrange(1, len(whole) - 1)],  # cut short
        "", " ", "{", "}", "\x00{", "{'type': 'session.update'}", '{"type": "session.update",}',
        "{" + _junk(rng, rng.randrange(1, 200)),
        '{"type": "input_audio_buffer.append", "audio": "' + "A" * rng.randrange(10, 5000),  # no end
        '{"type": 1' + "0" * 5000 + "}",  # an integer over Python's digit limit
        "[1, 2]", "null", "42", '"session.update"',
    ]), JSONISH


def binary(rng: random.Random) -> tuple[str | bytes, tuple[str, ...]]:
    return rng.choice([
        bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 4096))),
        b"\x00\xff" * rng.randrange(1, 2000),
        b"\xef\xbb\xbf{}",  # a BOM, then an object without a type
        json.dumps({"type": "no.such.event"}).encode(),
        json.dumps({"type": "input_audio_buffer.append"}).encode(),
        json.dumps([{"type": "response.create"}]).encode(),
    ]), JSONISH


def wrong_types(rng: random.Random) -> tuple[str | bytes, tuple[str, ...]]:
    odd = rng.choice([42, 1.5, True, None, [], {}, "x", [1, "a"], {"a": 1}])
    return rng.choice([
        _event("session.update", session={"type": "realtime", "instructions": rng.choice([42, [], {}, True])}),
        _event("session.update", session=rng.choice([42, "realtime", [], True])),
        _event("session.update", session={"type": "realtime", "audio": rng.choice([1, "x", []])}),
        _event("session.update", session={"audio": {"input": {"format": {"type": "audio/pcm",
                                                                          "rate": rng.choice(["24000", 24000.5])}}}}),
        _event("session.update", session={"audio": {"input": {"turn_detection": {"type": "server_vad",
                                                                                  "threshold": "high"}}}}),
        _event("session.update", session={"audio": {"output": {"voice": rng.choice([7, [], True])}}}),
        _event("session.update", session={"tools": rng.choice([{}, "all", 3])}),
        _event("input_audio_buffer.append", audio=rng.choice([123, None, [], {"b64": "AAAA"}, True])),
        _event("conversation.item.create", item=rng.choice(["hello", 5, [], None])),
        _event("conversation.item.create", item={"type": "message", "role": "user", "content": "hello"}),
        _event("conversation.item.create", item={"type": "message", "role": "user", "content": [odd]}),
        _event("conversation.item.delete", item_id=rng.choice([5, None, [], {}])),
        _event("conversation.item.truncate", item_id="item_x", content_index=0, audio_end_ms="100"),
        _event("response.create", response=rng.choice([[], "now", 1])),
        json.dumps({"type": rng.choice([1, None, [], {}, True])}),
        _event("input_audio_buffer.commit", extra=odd),
    ]), WRONG + ("invalid_request",)


def huge(rng: random.Random) -> tuple[str | bytes, tuple[str, ...]]:
    size = MAX_FRAME + rng.randrange(1, 200_000)  # over max_frame_bytes, under the hard cap: an error, not a close
    return rng.choice([
        _event("input_audio_buffer.append", audio="A" * size),
        _event("session.update", session={"type": "realtime", "instructions": "x" * size}),
        "x" * size,
        bytes(size),
    ]), ("frame_too_large",)


def nested(rng: random.Random) -> tuple[str | bytes, tuple[str, ...]]:
    if rng.random() < 0.6:  # deeper than any parser's stack
        depth = DEEP
        return rng.choice([
            "[" * depth + "]" * depth,
            '{"a":' * depth + "1" + "}" * depth,
            '{"type": "session.update", "session": ' + "[" * depth + "]" * depth + "}",
            '{"type": "conversation.item.create", "item": ' + '{"x":' * depth + "0" + "}" * depth + "}",
        ]), JSONISH
    depth = rng.randrange(100, 900)  # parses, and must still be refused where it sits
    deep_list = "[" * depth + "]" * depth
    deep_dict = '{"x":' * depth + "0" + "}" * depth
    return rng.choice([
        '{"type": "session.update", "session": {"type": "realtime", "instructions": ' + deep_list + "}}",
        '{"type": "session.update", "session": {"audio": {"input": ' + deep_dict + "}}}",
        '{"type": "session.update", "session": {"tools": [' + deep_dict + "]}}",
        '{"type": "conversation.item.create", "item": {"type": "message", "content": [' + deep_dict + "]}}",
        '{"type": "input_audio_buffer.append", "audio": ' + deep_list + "}",
        '{"type": "response.create", "response": {"metadata": ' + deep_dict + ', "output_modalities": []}}',
        '{"type": "conversation.item.retrieve", "item_id": ' + deep_dict + "}",
        '{"type": ' + deep_list + "}",
    ]), WRONG


def bad_base64(rng: random.Random) -> tuple[str | bytes, tuple[str, ...]]:
    odd = bytes(rng.getrandbits(8) for _ in range(2 * rng.randrange(0, 500) + 1))
    audio = rng.choice([
        "not base64 !!", "A", "AB", "ABC", "====", "A===", "AAAA" * rng.randrange(1, 100) + "*",
        base64.b64encode(odd).decode(),  # an odd byte count is not PCM16
        base64.b64encode(odd).decode().rstrip("="),
        base64.urlsafe_b64encode(b"\xfb\xff" * 64).decode(),  # - and _ are not in the standard alphabet
        _junk(rng, rng.randrange(1, 300)),
        "AAAA\nAAAA", "AA AA",
    ])
    return _event("input_audio_buffer.append", audio=audio), ("invalid_audio",)


def out_of_range(rng: random.Random) -> tuple[str | bytes, tuple[str, ...]]:
    huge_numbers = [10 ** 30, -(10 ** 30), 1e308, -1e308, float("nan"), float("inf"), float("-inf")]
    rate = rng.choice([0, -1, 1000, 7999, 48001, 96000, *huge_numbers])
    threshold = rng.choice([0, 1, 3, -0.5, 1.0000001, *huge_numbers])
    ms = rng.choice([-1, -(10 ** 9), 10 ** 12, 10 ** 30])
    speed = rng.choice([0, 0.1, 0.24, 1.51, 100, -1, *huge_numbers])
    where = rng.choice(["input", "output"])
    return rng.choice([
        _event("session.update", session={"audio": {where: {"format": {"type": "audio/pcm", "rate": rate}}}}),
        _event("session.update", session={"audio": {"input": {"turn_detection": {"type": "server_vad",
                                                                                  "threshold": threshold}}}}),
        _event("session.update", session={"audio": {"input": {"turn_detection": {
            "type": "server_vad", rng.choice(["silence_duration_ms", "prefix_padding_ms"]): ms}}}}),
        _event("session.update", session={"audio": {"output": {"speed": speed}}}),
        _event("conversation.item.truncate", item_id="item_x", content_index=0, audio_end_ms=rng.choice(
            [-1, -(10 ** 30)])),
        _event("conversation.item.truncate", item_id="item_x", content_index=rng.choice([1, -1, 10 ** 30]),
               audio_end_ms=0),
    ]), WRONG


def unknown_item(rng: random.Random) -> tuple[str | bytes, tuple[str, ...]]:
    item_id = rng.choice([f"item_{rng.getrandbits(80):020x}", "", "item_" + "z" * 5000, _junk(rng, 40),
                          "item_../../etc/passwd"])
    kind = rng.choice(["delete", "retrieve", "truncate"])
    extra = {"content_index": 0, "audio_end_ms": rng.randrange(0, 10 ** 6)} if kind == "truncate" else {}
    return _event(f"conversation.item.{kind}", item_id=item_id, **extra), ("invalid_value",)


KINDS = [broken_json, binary, wrong_types, huge, nested, bad_base64, out_of_range, unknown_item]


def plan(rng: random.Random, count: int) -> list[tuple[str, str | bytes, tuple[str, ...]]]:
    frames = []
    for index in range(count):
        kind = KINDS[index % len(KINDS)] if index < len(KINDS) else rng.choice(KINDS)  # every kind at least once
        frame, codes = kind(rng)
        frames.append((kind.__name__, frame, codes))
    return frames


# ---------------------------------------------------------------------------------------------- the clients
def raw_connect(server: RunningServer, **options):
    return open_websocket(server.url, additional_headers={"Authorization": f"Bearer {API_KEY}"}, max_size=None,
                   open_timeout=WAIT_S, close_timeout=2, **options)


def fuzz_session(server: RunningServer, frames, rng: random.Random, ready: threading.Barrier, deadline: float,
                 problems: list[str], answered: list[int]) -> None:
    """Send ``frames`` in bursts of 1-8 (later ones go out before the earlier ones' errors are read); each must
    get its own ``error``, in order."""
    connection = raw_connect(server)
    try:
        first = json.loads(connection.recv(timeout=WAIT_S))
        assert first["type"] == "session.created", first
        ready.wait(WAIT_S)
        start = 0
        while start < len(frames):
            if time.monotonic() > deadline:
                problems.append(f"out of time after {start} frames")
                return
            burst = frames[start:start + rng.randint(1, 8)]
            for _, frame, _ in burst:
                connection.send(frame)
            for index, (kind, frame, codes) in enumerate(burst, start):
                got = json.loads(connection.recv(timeout=WAIT_S))
                if got["type"] != "error":
                    problems.append(f"{kind} #{index}: got {got['type']} instead of an error for {frame[:200]!r}")
                    continue
                code = got["error"]["code"]
                if code not in codes:
                    problems.append(f"{kind} #{index}: code {code} ({got['error']['message'][:200]}) not in "
                                    f"{codes} for {frame[:200]!r}")
                answered[0] += 1
            start += len(burst)
        # still a working session: a good update is applied
        connection.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                                                          "instructions": "Still here."}}))
        got = json.loads(connection.recv(timeout=WAIT_S))
        if got["type"] != "session.updated" or got["session"]["instructions"] != "Still here.":
            problems.append(f"after the fuzz: {got}")
    except Exception as error:  # noqa: BLE001 - reported by the test
        problems.append(f"session failed: {type(error).__name__}: {error}")
    finally:
        connection.close()


def _masked_frame_head(opcode: int, length: int) -> bytes:
    """The head of one masked client frame whose payload is ``length`` bytes (the payload to follow)."""
    if length < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
    return head + os.urandom(4)


def churn(server: RunningServer, rng: random.Random, deadline: float, problems: list[str],
          seen: dict[str, int]) -> None:
    from websockets.exceptions import ConnectionClosed

    def tally(what: str) -> None:
        seen[what] = seen.get(what, 0) + 1

    def free_slot() -> None:
        """Until the churner's earlier session is freed (just after its client goes) and a pipeline is free."""
        until = min(deadline, time.monotonic() + WAIT_S)
        while server.get("/v1/sessions")[1].get("active", 0) > SESSIONS and time.monotonic() < until:
            time.sleep(0.1)

    def refused(connection, error: dict) -> None:
        """A session over the limit: ``session_limit_reached``, then close code 1013; then a pipeline is awaited."""
        if error["error"]["code"] != "session_limit_reached":
            problems.append(f"a churned connection got {error['error']}")
        try:
            connection.recv(timeout=WAIT_S)
            problems.append("a refused connection was not closed")
        except ConnectionClosed:
            pass
        if connection.close_code != 1013:
            problems.append(f"a refused connection closed with {connection.close_code}, not 1013")
        tally("refused")
        free_slot()

    again: int | None = None  # a way that was refused (every pipeline busy) is tried again once one is free
    for index in range(CHURN):
        if time.monotonic() > deadline:
            problems.append(f"churn out of time after {index} connections")
            return
        # every way at least once, then at random
        way = again if again is not None else index % 6 if index < 6 else rng.randrange(6)
        again = None
        try:
            if way == 0:  # open and close at once, maybe before session.created
                raw_connect(server).close()
                tally("closed at once")
            elif way == 1:  # a TCP connection that never finishes its handshake
                with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S) as sock:
                    sock.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgr")
                tally("half a handshake")
            elif way in (2, 3):  # gone mid-frame: half a frame, then the socket closes without a close frame
                connection = raw_connect(server)
                if (first := json.loads(connection.recv(timeout=WAIT_S)))["type"] == "error":
                    refused(connection, first)  # all pipelines still busy with an earlier churn
                    again = way
                    continue
                payload = _event("session.update", session={"instructions": "x" * rng.randrange(10, 100_000)})
                data = payload.encode()
                head = _masked_frame_head(0x1, len(data))
                connection.socket.sendall(head + data[:rng.randrange(0, len(data))])
                connection.close_socket()
                tally("vanished mid-frame")
            elif way == 4:  # a text frame that is not UTF-8: the WebSocket protocol's own close, 1007
                connection = raw_connect(server)
                if (first := json.loads(connection.recv(timeout=WAIT_S)))["type"] == "error":
                    refused(connection, first)
                    again = way
                    continue
                data = b"\xff\xfe" + _junk(rng, 20).encode()
                head = _masked_frame_head(0x1, len(data))
                mask = head[-4:]
                connection.socket.sendall(head + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
                try:
                    while True:
                        connection.recv(timeout=WAIT_S)
                except ConnectionClosed:
                    pass
                except TimeoutError:
                    problems.append("a text frame that is not UTF-8 did not close its connection")
                if connection.close_code != 1007:
                    problems.append(f"a text frame that is not UTF-8 closed with {connection.close_code}, not 1007")
                tally("not UTF-8")
            else:  # a frame over the hard cap: the server must refuse it with 1009
                connection = raw_connect(server)
                first = json.loads(connection.recv(timeout=WAIT_S))
                if first["type"] == "error":  # all pipelines still busy with an earlier churn: 1013
                    refused(connection, first)
                    again = way
                    continue
                try:
                    connection.send("x" * (HARD_CAP + rng.randrange(1, 100_000)))
                    while True:
                        connection.recv(timeout=WAIT_S)
                except ConnectionClosed:
                    pass
                except TimeoutError:
                    problems.append("a frame over the hard cap did not close its connection")
                if connection.close_code != 1009:
                    problems.append(f"a frame over the hard cap closed with {connection.close_code}, not 1009")
                tally("over the hard cap")
        except Exception as error:  # noqa: BLE001 - reported by the test
            problems.append(f"churn #{index} ({way}): {type(error).__name__}: {error}")


# ---------------------------------------------------------------------------------------------- the test
def test_a_seeded_protocol_fuzz_gets_errors_and_the_server_keeps_serving(server, espeak, tmp_path):
    rng = random.Random(SEED)
    random.seed(SEED)  # the event ids of _event
    frames = plan(rng, FRAMES)
    per_session = [frames[index::SESSIONS] for index in range(SESSIONS)]
    assert server.get("/health", api_key=None) == (200, {"status": "ok"})
    pid = server.process.pid
    before = rss_mb(pid)

    problems: list[str] = []
    answered = [[0] for _ in range(SESSIONS)]
    seen: dict[str, int] = {}
    ready = threading.Barrier(SESSIONS + 1)
    started = time.monotonic()
    deadline = started + FUZZ_S
    threads = [threading.Thread(target=fuzz_session, args=(server, chunk, random.Random(SEED + 2 + index), ready,
                                                           deadline, problems, count), daemon=True)
               for index, (chunk, count) in enumerate(zip(per_session, answered))]
    for thread in threads:
        thread.start()
    ready.wait(WAIT_S * 3)  # every fuzzing session holds its pipeline before the churn starts
    churner = threading.Thread(target=churn, args=(server, random.Random(SEED + 1), deadline, problems, seen),
                               daemon=True)
    churner.start()
    peak = before
    health: list[tuple[int, dict]] = []
    while any(thread.is_alive() for thread in [*threads, churner]) and time.monotonic() < deadline + WAIT_S:
        health.append(server.get("/health", api_key=None))
        peak = max(peak, rss_mb(pid))
        time.sleep(0.5)
    for thread in [*threads, churner]:
        thread.join(1.0)
        assert not thread.is_alive(), "a fuzzing client hung"
    elapsed = time.monotonic() - started

    print(f"fuzz seed {SEED}: {FRAMES} frames in {elapsed:.1f} s, churn {seen}, RSS {before:.0f} -> peak "
          f"{peak:.0f} MB")
    assert not problems, "\n".join(problems[:30])
    assert sum(count[0] for count in answered) == FRAMES
    assert elapsed < FUZZ_S
    assert set(seen) >= {"closed at once", "half a handshake", "vanished mid-frame", "over the hard cap",
                         "not UTF-8"}, seen
    assert server.alive(), server.output[-3000:]
    assert health and all(answer == (200, {"status": "ok"}) for answer in health), health[:5]
    server.wait_idle()
    assert server.get("/v1/sessions")[1]["active"] == 0
    after = rss_mb(pid)
    assert max(peak, after) - before < RSS_GROWTH_MB, (before, peak, after)
    records = log_records(server.output)
    failures = [record for record in records if "Traceback" in record or "server_error" in record]
    assert not failures, failures[:3]
    # a handshake the client cut short is one line each (websockets alone writes three tracebacks), and it is
    # the client's doing: INFO
    abandoned = [record for record in records if "opening handshake failed" in record]
    assert len(abandoned) >= seen["half a handshake"], abandoned
    assert all("\n" not in record.strip() and "[INFO]" in record for record in abandoned), abandoned[:3]

    # a normal session is still heard and answered aloud
    clip = espeak("The quick brown fox jumps over the lazy dog.", tmp_path / "fox.wav")
    with openai_client(server).realtime.connect(model="s2s-test") as connection:
        events = Events(connection)
        events.until("session.created", 30)
        send_speech(connection, pcm16(clip))
        heard = events.until("conversation.item.input_audio_transcription.completed", 120)
        assert "quick" in heard.transcript.lower()
        done = events.until("response.done", 120)
        assert done.response.status == "completed"
        assert len(reply_audio(events.all, done.response.id)) > 0.3 * 24000
    assert server.alive() and server.get("/health", api_key=None) == (200, {"status": "ok"})

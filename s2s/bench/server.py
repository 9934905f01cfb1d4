"""``python -m s2s.bench server --sessions N --seconds T``: a bounded load on the realtime server, loopback only.

N clients speak the same question at the pace of speech, turn after turn, for T seconds; like a person, each
speaks again once the reply has played (its microphone sending silence meanwhile). Voice-to-voice is
measured on each client's clock, from the end of the question's speech (its last voiced sample, as sent) to
the first reply audio received, so endpointing, the network hop and every stage are in it. Without ``--url``
the command starts a server itself (``run.py server=realtime server.port=0 server.max_sessions=N``, plus any
``--override``) and stops it at the end. ``--transport both`` compares WebRTC with WebSocket instead, one session
of each taking turns (:mod:`s2s.bench.transports`).
"""
from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import numpy as np

from s2s import audio
from s2s.bench.real_speech import noise_floor

RATE = 24000
CHUNK_S = 0.1
MAX_SESSIONS, MAX_SECONDS = 16, 900
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Load:
    sessions: int
    held: int = 0
    refused: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    voice_to_voice: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or re.fullmatch(r"127(\.\d{1,3}){3}", host) is not None


def speech_end_s(samples: np.ndarray, rate: int) -> float:
    """Where the last voiced sample is, in seconds from the start: the last one above :func:`s2s.audio.sound_level`
    of the recording's peak and its noise floor (:func:`s2s.bench.real_speech.noise_floor`, an RMS level)."""
    level = np.abs(samples)
    loud = np.flatnonzero(level > audio.sound_level(level.max() or 1.0, noise_floor(samples)))
    return (loud[-1] + 1) / rate if len(loud) else 0.0


async def send_paced(socket: Any, samples: np.ndarray, rate: int = RATE) -> float:
    """``samples`` as ``input_audio_buffer.append`` events of CHUNK_S each, at the pace of speech.

    Returns:
        When the first block went out (``time.monotonic()``): the clock a client's end of speech is on.
    """
    step = int(CHUNK_S * rate)
    start = time.monotonic()
    for index, offset in enumerate(range(0, len(samples), step)):
        block = audio.float_to_int16(samples[offset:offset + step]).astype("<i2")
        await socket.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(block.tobytes()).decode()}))
        await asyncio.sleep(max(0.0, start + (index + 1) * CHUNK_S - time.monotonic()))
    return start


async def send_silence_until(socket: Any, until: float) -> None:
    """A microphone's silence, at the pace of speech, until ``until`` (``time.monotonic()``)."""
    block = base64.b64encode(bytes(2 * int(CHUNK_S * RATE))).decode()
    while (left := until - time.monotonic()) > 0:
        await socket.send(json.dumps({"type": "input_audio_buffer.append", "audio": block}))
        await asyncio.sleep(min(CHUNK_S, left))


async def _client(url: str, api_key: str | None, speech: np.ndarray, deadline: float, load: Load,
                  reply_timeout_s: float) -> None:
    from websockets.asyncio.client import connect

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    end_of_speech = speech_end_s(speech, RATE)
    silence = audio.silence(1.5, RATE)
    async with connect(url, additional_headers=headers, max_size=None, open_timeout=30) as socket:
        first = json.loads(await socket.recv())
        if first.get("type") == "error":
            load.refused += 1
            return
        load.held += 1
        done: asyncio.Queue[tuple[str, float | None, float]] = asyncio.Queue()
        first_audio: list[float] = []
        reply_bytes = [0]

        async def receive() -> None:
            async for frame in socket:
                event = json.loads(frame)
                kind = event.get("type")
                if kind == "response.output_audio.delta":
                    if not first_audio:
                        first_audio.append(time.monotonic())
                    reply_bytes[0] += len(base64.b64decode(event.get("delta", "")))
                elif kind == "response.done":
                    done.put_nowait((event["response"]["status"], first_audio[0] if first_audio else None,
                                     reply_bytes[0] / 2 / RATE))  # PCM16 at the session's (default) rate
                    first_audio.clear()
                    reply_bytes[0] = 0
                elif kind == "error":
                    load.errors.append(event["error"].get("message", ""))

        receiver = asyncio.create_task(receive())
        try:
            while time.monotonic() < deadline:
                start = await send_paced(socket, np.concatenate([speech, silence]))
                spoken_end = start + end_of_speech
                try:
                    status, audio_at, reply_s = await asyncio.wait_for(done.get(), reply_timeout_s)
                except TimeoutError:
                    load.failed += 1
                    break
                if audio_at is not None:  # the user listens to the whole reply before speaking again
                    await send_silence_until(socket, audio_at + reply_s)
                if status == "completed" and audio_at is not None:
                    load.completed += 1
                    load.voice_to_voice.append(audio_at - spoken_end)
                elif status == "cancelled":
                    load.cancelled += 1
                else:
                    load.failed += 1
        finally:
            receiver.cancel()


async def _load(url: str, api_key: str | None, sessions: int, seconds: float, speech: np.ndarray,
                reply_timeout_s: float) -> Load:
    load = Load(sessions)
    deadline = time.monotonic() + seconds
    results = await asyncio.gather(*(_client(url, api_key, speech, deadline, load, reply_timeout_s)
                                     for _ in range(sessions)), return_exceptions=True)
    load.errors += [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
    return load


def report(load: Load, seconds: float, url: str) -> str:
    lines = [f"server load: {load.sessions} session(s) for {seconds:g} s against {url}",
             f"sessions held: {load.held} of {load.sessions} (refused {load.refused})",
             f"replies completed: {load.completed} (cancelled {load.cancelled}, failed or timed out {load.failed})"]
    if load.voice_to_voice:
        p50, p90 = np.percentile(load.voice_to_voice, [50, 90])
        lines.append(f"voice-to-voice, end of speech -> first reply audio (client clock): p50 {p50:.2f} s, "
                     f"p90 {p90:.2f} s, max {max(load.voice_to_voice):.2f} s over {len(load.voice_to_voice)} "
                     f"replies")
    else:
        lines.append("voice-to-voice: no completed reply (p50 -, p90 -)")
    for error in sorted(set(load.errors))[:5]:
        lines.append(f"error: {error}")
    return "\n".join(lines)


@contextlib.contextmanager
def served(url: str | None, sessions: int, overrides: list[str], run_dir: Path,
           api_key: str | None = None) -> Iterator[str]:
    """``url`` as given, or (None) our server, started for the block and stopped after it.

    A SIGTERM to the bench stops the server too (it becomes SystemExit, so the block unwinds): a bench ended by
    a timeout or a job runner would otherwise leave its server running.

    Args:
        url: a running server's; None: start ``run.py server=realtime`` on 127.0.0.1 and a free port.
        sessions, overrides, run_dir: the started server's ``max_sessions``, config overrides and run folder.
        api_key: the key it requires (``S2S_API_KEY`` of its environment); None: the caller's environment decides.
    """
    if url is not None:
        yield url
        return
    main = threading.current_thread() is threading.main_thread()  # only the main thread may set a handler
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None
    process = None
    try:
        process, url = _start_server(sessions, overrides, run_dir, api_key)
        yield url
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        if process is not None:
            _stop_server(process)


def _terminated(signum: int, frame: Any) -> NoReturn:
    raise SystemExit(128 + signum)


def _start_server(sessions: int, overrides: list[str], run_dir: Path,
                  api_key: str | None) -> tuple[subprocess.Popen, str]:
    """The process and its URL once it listens; it is killed if it does not, or if the wait is interrupted."""
    command = [sys.executable, str(ROOT / "run.py"), "server=realtime", "server.host=127.0.0.1", "server.port=0",
               f"server.max_sessions={sessions}", f"hydra.run.dir={run_dir}", *overrides]
    env = {**os.environ, **({"S2S_API_KEY": api_key} if api_key else {})}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    assert process.stdout is not None
    started = time.monotonic()
    url: str | None = None
    last: collections.deque[str] = collections.deque(maxlen=20)  # shown if it never listens
    try:
        for line in process.stdout:
            last.append(line)
            if found := re.search(r"listening on (ws://127\.0\.0\.1:\d+/v1/realtime)", line):
                url = found.group(1)
                # its log is in run_dir; the pipe is drained so that a long run never blocks the server's writes
                threading.Thread(target=collections.deque, args=(process.stdout, 0), daemon=True).start()
                return process, url
            if time.monotonic() - started > 600:
                break
    finally:
        if url is None:
            process.kill()
            process.wait(timeout=10)
    raise RuntimeError("the server did not start:\n" + "".join(last))


def bench_server(args: Any) -> int:
    if not 1 <= args.sessions <= MAX_SESSIONS or not 0 < args.seconds <= MAX_SECONDS:
        raise ValueError(f"--sessions 1-{MAX_SESSIONS} and --seconds up to {MAX_SECONDS}")
    with server_for(args, args.sessions) as (url, speech):
        load = asyncio.run(_load(url, args.api_key, args.sessions, args.seconds, speech, args.reply_timeout))
        print(report(load, args.seconds, url))
        server_side = _server_figures(url, args.api_key)
        if server_side:
            print(server_side)
    return 0


@contextlib.contextmanager
def server_for(args: Any, sessions: int) -> Iterator[tuple[str, np.ndarray]]:
    """The server to measure (``--url``, on this machine, or one started with ``sessions`` pipelines and stopped
    at the end) and the question each client speaks, at :data:`RATE`."""
    if args.url and not is_loopback(args.url):
        raise ValueError(f"--url {args.url}: the load test only targets this machine (127.0.0.1, localhost, ::1)")
    path = args.file or Path(__file__).resolve().parents[1] / "samples" / "question.wav"
    speech = audio.read_audio(path, RATE)
    run_dir = Path(args.run_dir or f"outputs/bench-server-{time.strftime('%Y%m%d-%H%M%S')}")
    with served(args.url, sessions, args.override, run_dir) as url:
        yield url, speech


def _stop_server(process: subprocess.Popen) -> None:
    """SIGTERM, then a kill if it has not stopped within 30 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def _server_figures(url: str, api_key: str | None) -> str | None:
    """The server's own per-turn voice-to-voice (its Recorder, end of the VAD's turn -> first audio at the sink)."""
    parts = urlsplit(url)
    request = urllib.request.Request(f"http://{parts.netloc}/v1/sessions")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            document = json.loads(response.read())
    except OSError:
        return None
    values = [turn["timings"]["voice_to_voice_s"] for session in document.get("sessions", [])
              for turn in session.get("turns", []) if turn.get("timings", {}).get("voice_to_voice_s") is not None]
    if not values:
        return None
    p50, p90 = np.percentile(values, [50, 90])
    return f"server metrics (GET /v1/sessions, all sessions so far): voice-to-voice p50 {p50:.2f} s, p90 {p90:.2f} s"


def add_arguments(parser: Any) -> None:
    parser.add_argument("--sessions", type=int, default=2, help=f"concurrent clients (1-{MAX_SESSIONS})")
    parser.add_argument("--seconds", type=float, default=60.0, help=f"how long to keep talking (at most "
                                                                   f"{MAX_SECONDS})")
    parser.add_argument("--url", help="a running server on this machine; default: start one")
    parser.add_argument("--api-key", default=os.environ.get("S2S_API_KEY"), help="default: $S2S_API_KEY")
    parser.add_argument("--file", type=Path, help="the question each client speaks (default: the bundled one)")
    parser.add_argument("--override", action="append", default=[],
                        help="a config override for the server it starts (repeatable), e.g. llm.max_new_tokens=32")
    parser.add_argument("--reply-timeout", type=float, default=90.0, help="seconds to wait for one reply")
    parser.add_argument("--run-dir", help="the started server's run folder (default outputs/bench-server-<time>)")
    parser.add_argument("--transport", choices=("websocket", "both"), default="websocket",
                        help="both: one WebSocket session and one WebRTC call (extra webrtc) take turns, and "
                             "voice-to-voice is reported per transport (--sessions is not used)")

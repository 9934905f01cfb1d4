"""``python -m s2s.bench server --transport both``: voice-to-voice over WebRTC against WebSocket, interleaved.

One WebSocket session and one WebRTC call (:mod:`s2s.rtc_client`) stay open on the same server; they take turns
speaking the same question at the pace of speech, one turn at a time, so both see the same load. Each figure runs
on the client's clock from the end of the question's speech (its last voiced sample, as sent) to the first reply
audio received: over the WebSocket the first ``response.output_audio.delta``, over WebRTC the first audible
decoded frame of the reply's track (so Opus both ways and aiortc's jitter buffer are in it).
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np

from s2s import audio
from s2s.bench.server import MAX_SECONDS, RATE, send_paced, server_for, speech_end_s

TRANSPORTS = ("websocket", "webrtc")


async def _websocket_turn(socket: Any, speech: np.ndarray, reply_timeout_s: float) -> float | None:
    """One turn over the WebSocket; its voice-to-voice, or None when the reply did not complete."""
    first_audio: list[float] = []

    async def receive() -> bool:  # reads while the question is sent: the reply may start in its trailing silence
        while True:
            event = json.loads(await socket.recv())
            if event["type"] == "response.output_audio.delta" and not first_audio:
                first_audio.append(time.monotonic())
            elif event["type"] == "response.done":
                return event["response"]["status"] == "completed"

    receiver = asyncio.create_task(receive())
    start = await send_paced(socket, np.concatenate([speech, audio.silence(1.5, RATE)]))
    spoken_end = start + speech_end_s(speech, RATE)
    try:
        completed = await asyncio.wait_for(receiver, reply_timeout_s)
    except TimeoutError:
        return None
    return first_audio[0] - spoken_end if completed and first_audio else None


async def _webrtc_turn(call: Any, speech: np.ndarray, reply_timeout_s: float) -> float | None:
    """One turn over the WebRTC call; its voice-to-voice, or None when no reply was heard."""
    before = len(call.of("output_audio_buffer.stopped"))
    start = call.say(np.concatenate([speech, audio.silence(1.5, RATE)]), RATE)
    spoken_end = start + speech_end_s(speech, RATE)
    deadline = time.monotonic() + reply_timeout_s
    while len(call.of("output_audio_buffer.stopped")) <= before and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the reply has played out: the next turn starts in silence
    heard = call.first_sound_after(spoken_end)
    return None if heard is None or time.monotonic() >= deadline else heard - spoken_end


async def compare(url: str, api_key: str | None, seconds: float, speech: np.ndarray,
                  reply_timeout_s: float) -> dict[str, list[float]]:
    """Voice-to-voice per transport, turns alternating between the two until ``seconds`` have passed."""
    from websockets.asyncio.client import connect

    from s2s.rtc_client import RtcCall

    figures: dict[str, list[float]] = {name: [] for name in TRANSPORTS}
    figures["failed"] = []
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    call = RtcCall(url.replace("ws://", "http://").rsplit("/v1/", 1)[0], api_key)
    async with connect(url, additional_headers=headers, max_size=None, open_timeout=30) as socket:
        if json.loads(await socket.recv())["type"] != "session.created":
            raise RuntimeError("the WebSocket session was refused")
        await call.start()
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for name in TRANSPORTS:
                    turn = _websocket_turn(socket, speech, reply_timeout_s) if name == "websocket" \
                        else _webrtc_turn(call, speech, reply_timeout_s)
                    value = await turn
                    (figures[name].append(value) if value is not None else figures["failed"].append(1.0))
        finally:
            await call.close()
    return figures


def report(figures: dict[str, list[float]], seconds: float, url: str) -> str:
    lines = [f"voice-to-voice by transport, interleaved turns for {seconds:g} s against {url} (client clock: end "
             f"of speech -> first reply audio received)"]
    for name in TRANSPORTS:
        values = figures[name]
        if values:
            p50, p90 = np.percentile(values, [50, 90])
            lines.append(f"{name:>9}: p50 {p50:.2f} s, p90 {p90:.2f} s, min {min(values):.2f} s over "
                         f"{len(values)} turns")
        else:
            lines.append(f"{name:>9}: no completed turn")
    if figures["failed"]:
        lines.append(f"turns without a reply: {len(figures['failed'])}")
    return "\n".join(lines)


def bench_transports(args: Any) -> int:
    """``--transport both``: the interleaved comparison, printed."""
    if not 0 < args.seconds <= MAX_SECONDS:
        raise ValueError(f"--seconds up to {MAX_SECONDS}")
    with server_for(args, 2) as (url, speech):
        figures = asyncio.run(compare(url, args.api_key, args.seconds, speech, args.reply_timeout))
        print(report(figures, args.seconds, url))
    return 0

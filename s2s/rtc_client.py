"""A WebRTC client of the realtime server (aiortc, the ``webrtc`` extra), as a browser would call it.

It offers an Opus microphone track and the ``oai-events`` data channel, ``POST``s the offer to
``/v1/realtime/calls`` and takes the answer; then it speaks what it is given at the pace of speech, records the
reply audio it hears with the time each frame came, and keeps every server event. ``python -m s2s.bench server
--transport webrtc`` measures with it; the server's WebRTC tests call with it.
"""
from __future__ import annotations

import asyncio
import fractions
import json
import time
import urllib.error
import urllib.request
from collections import deque
from typing import Any

import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from s2s import audio

RATE = 48000
FRAME = 960  # 20 ms
AUDIBLE = 0.02  # a received frame with a sample above this (of full scale) is reply sound


class Microphone(MediaStreamTrack):
    """Speaks what :meth:`say` queues (float32 mono at 48 kHz) in 20 ms frames at the clock's pace; else silence."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[np.ndarray] = deque()
        self._start: float | None = None
        self._sent = 0

    def say(self, samples: np.ndarray) -> float:
        """Queue ``samples``; returns when (monotonic clock) their first sample will go out, roughly."""
        waiting = sum(map(len, self._queue)) / RATE
        self._queue.extend(audio.chunks(audio.float_to_int16(samples), FRAME))
        return time.monotonic() + waiting

    @property
    def speaking(self) -> bool:
        return bool(self._queue)

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        self._start = now if self._start is None else self._start
        await asyncio.sleep(max(0.0, self._start + self._sent * FRAME / RATE - now))
        block = self._queue.popleft() if self._queue else np.zeros(FRAME, dtype=np.int16)
        block = np.pad(block, (0, FRAME - len(block)))
        frame = AudioFrame.from_ndarray(block.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._sent * FRAME, fractions.Fraction(1, RATE)
        self._sent += 1
        return frame


class CallError(RuntimeError):
    """The server refused the call: ``status`` and its JSON ``error``."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body}")
        self.status, self.body = status, body


class RtcCall:
    """One call: :meth:`start` it, :meth:`say` things, read :attr:`events` and :attr:`heard`, :meth:`close` it.

    Args:
        base: the server's HTTP root, e.g. ``http://127.0.0.1:8765``.
        api_key: sent as the Bearer key (the server's, or a client secret); None: none.
    """

    def __init__(self, base: str, api_key: str | None = None) -> None:
        self.base, self.api_key = base.rstrip("/"), api_key
        self.pc = RTCPeerConnection()
        self.microphone = Microphone()
        self.channel = self.pc.createDataChannel("oai-events")
        self.events: list[dict[str, Any]] = []
        self.arrived: list[float] = []  # when each event came (monotonic clock)
        self.heard: list[tuple[float, np.ndarray]] = []  # (monotonic time it came, float32 mono at 48 kHz)
        self.location: str | None = None
        self._new = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.channel.on("message", self._on_message)
        self.pc.on("track", lambda track: self._tasks.append(asyncio.ensure_future(self._listen(track))))

    def _on_message(self, message: str | bytes) -> None:
        self.events.append(json.loads(message))
        self.arrived.append(time.monotonic())
        self._new.set()

    async def _listen(self, track: Any) -> None:
        from s2s.server.rtc_audio import frame_floats

        while True:
            try:
                floats, _ = frame_floats(await track.recv())
            except MediaStreamError:
                return
            self.heard.append((time.monotonic(), floats))

    def _request(self, method: str, path: str, body: bytes | None, kind: str | None) -> tuple[int, dict, bytes]:
        request = urllib.request.Request(self.base + path, data=body, method=method)
        if kind:
            request.add_header("Content-Type", kind)
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    async def start(self, path: str = "/v1/realtime/calls", open_timeout_s: float = 20) -> None:
        """Offer, answer, and wait for the events channel to open; raises :class:`CallError` when refused."""
        self.pc.addTrack(self.microphone)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        status, headers, body = await asyncio.to_thread(self._request, "POST", path,
                                                        self.pc.localDescription.sdp.encode(), "application/sdp")
        if status != 201:
            raise CallError(status, json.loads(body or b"{}"))
        self.location = headers.get("Location")
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body.decode(), type="answer"))
        deadline = time.monotonic() + open_timeout_s
        while self.channel.readyState != "open":
            if time.monotonic() > deadline:
                raise TimeoutError(f"the events channel did not open within {open_timeout_s} s")
            await asyncio.sleep(0.02)

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    def say(self, samples: np.ndarray, rate: int) -> float:
        """Speak ``samples`` (float32 mono at ``rate``); returns when their first sample goes out."""
        return self.microphone.say(audio.resample(samples, rate, RATE))

    async def until(self, kind: str, timeout_s: float, where: Any = None) -> dict[str, Any]:
        """The first event of ``kind`` (matching ``where``), waiting at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = next((e for e in self.events if e["type"] == kind and (where is None or where(e))), None)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind} within {timeout_s} s; got {[e['type'] for e in self.events]}")
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                pass

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["type"] == kind]

    def first_sound_after(self, when: float) -> float | None:
        """When the first audible reply frame came after ``when`` (monotonic), or None."""
        return next((at for at, floats in self.heard if at > when and np.abs(floats).max() > AUDIBLE), None)

    def arrival(self, event: dict[str, Any]) -> float:
        """When ``event`` (one of :attr:`events`) came."""
        return self.arrived[next(i for i, e in enumerate(self.events) if e is event)]

    def sound_s(self, after: float = 0.0, before: float = float("inf")) -> float:
        """Seconds of audible reply audio heard (frames above :data:`AUDIBLE`) between ``after`` and ``before``."""
        return sum(len(f) for at, f in self.heard if after < at < before and np.abs(f).max() > AUDIBLE) / RATE

    async def hang_up(self) -> int:
        """``DELETE`` the call's location; returns the status."""
        assert self.location is not None
        status, _, _ = await asyncio.to_thread(self._request, "DELETE", self.location, None, None)
        return status

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.microphone.stop()
        await self.pc.close()

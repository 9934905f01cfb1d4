"""A WebRTC call's audio: the reply as a paced track of 20 ms Opus frames, the microphone as pipeline floats.

The server holds the playback buffer here (over a WebSocket the client holds it), so it knows what the user
has heard: a barge-in cuts the buffer and the assistant's item is truncated to what was played. Needs aiortc
(the ``webrtc`` extra); :mod:`s2s.server.webrtc` imports this module only once a call comes.
"""
from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from s2s import audio

RTC_RATE = 48000  # Opus's clock: WebRTC audio is 48 kHz both ways
FRAME_S = 0.02  # one Opus frame (the RTP packetisation time browsers use)
FRAME = int(RTC_RATE * FRAME_S)


def frame_floats(frame: Any) -> tuple[np.ndarray, int]:
    """A decoded audio frame (aiortc gives packed s16 stereo at 48 kHz) as float32 mono, and its rate."""
    samples = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        samples = samples.T  # (channels, n) -> (n, channels)
    samples = samples.reshape(-1, channels)
    return audio.to_mono(audio.to_float32(samples)), int(frame.sample_rate)


@dataclass
class _Playing:
    """One response's audio in the buffer: its ids, and how much of it has gone out."""

    response_id: str
    item_id: str
    played: int = 0  # samples at RTC_RATE
    finished: bool = False  # all its audio is queued (response.output_audio.done)
    started: bool = False


class Speaker(MediaStreamTrack):
    """The outbound track: reply audio queued as it is made, sent in 20 ms frames at the wall clock's pace.

    The sender pulls :meth:`recv`; between replies it gets silence, so the RTP clock never jumps. The first frame
    of a response's audio announces ``output_audio_buffer.started``, the last one of a finished response
    ``output_audio_buffer.stopped`` (through ``announce``, in the event loop), as OpenAI's WebRTC calls do.

    Args:
        announce: told of each (event type, response id).
    """

    kind = "audio"

    def __init__(self, announce: Callable[[str, str], None]) -> None:
        super().__init__()
        self._announce = announce
        self._queue: deque[tuple[_Playing, np.ndarray]] = deque()  # int16 blocks at RTC_RATE, oldest first
        self._responses: dict[str, _Playing] = {}
        self._start: float | None = None
        self._sent = 0  # frames since the first

    def play(self, response_id: str, item_id: str, samples: np.ndarray) -> None:
        """Queue int16 ``samples`` (at :data:`RTC_RATE`) of ``response_id``'s audio."""
        playing = self._responses.setdefault(response_id, _Playing(response_id, item_id))
        if len(samples):
            self._queue.append((playing, samples))

    def finish(self, response_id: str) -> None:
        """All of ``response_id``'s audio is queued: once it has played, it is stopped."""
        if (playing := self._responses.get(response_id)) is not None:
            playing.finished = True
            self._stop_if_played(playing)

    def clear(self, response_id: str | None = None) -> tuple[str, str, int] | None:
        """Drop what is queued (of ``response_id`` only, when given): (response id, item id, samples played) of
        the response that was cut, or None when nothing of it was waiting."""
        waiting = [playing for playing, _ in self._queue if response_id in (None, playing.response_id)]
        if not waiting:
            return None
        self._queue = deque(entry for entry in self._queue if entry[0] not in waiting)
        cut = waiting[0]
        for playing in waiting:
            self._responses.pop(playing.response_id, None)
        return cut.response_id, cut.item_id, cut.played

    def _stop_if_played(self, playing: _Playing) -> None:
        if playing.finished and not any(entry[0] is playing for entry in self._queue):
            self._responses.pop(playing.response_id, None)
            if playing.started:
                self._announce("output_audio_buffer.stopped", playing.response_id)

    def _next_frame(self) -> np.ndarray:
        """The next 20 ms of the queue (silence where it runs out), counting what each response has played."""
        out = np.zeros(FRAME, dtype=np.int16)
        filled = 0
        while filled < FRAME and self._queue:
            playing, block = self._queue[0]
            if not playing.started:
                playing.started = True
                self._announce("output_audio_buffer.started", playing.response_id)
            take = min(FRAME - filled, len(block))
            out[filled:filled + take] = block[:take]
            filled += take
            playing.played += take
            if take == len(block):
                self._queue.popleft()
                self._stop_if_played(playing)
            else:
                self._queue[0] = (playing, block[take:])
        return out

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        else:  # paced by the clock: the frame after ``_sent`` frames is due ``_sent`` * 20 ms after the first
            await asyncio.sleep(max(0.0, self._start + self._sent * FRAME_S - now))
        samples = self._next_frame()
        frame = AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RTC_RATE
        frame.pts = self._sent * FRAME
        frame.time_base = fractions.Fraction(1, RTC_RATE)
        self._sent += 1
        return frame

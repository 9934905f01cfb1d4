"""``idle_timeout_ms`` (server_vad): a user who stays silent after a reply is prompted, as OpenAI's sessions do.

OpenAI starts the timeout when the last response's audio has finished playing (its ``response.done`` time
plus the audio's duration). When it runs out with no speech, the server sends
``input_audio_buffer.timeout_triggered`` (``audio_start_ms``/``audio_end_ms``: the silent span of the input),
commits that silence as a user audio item and makes a response, which prompts the user to go on. Speech, a
commit, or another response first cancels it. Over WebSocket the server does not see playback: the audio is
taken to play from its first delta on, at its own pace, so it ends at the later of ``response.done`` and the
first delta's time plus its duration.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from s2s.server.protocol import TurnDetection

# what the LLM reads as the user's side of that turn (the client's item is the silent audio, transcript "")
IDLE_NOTE = "(The user has said nothing for {seconds:g} seconds.)"


class IdleTimer:
    """When the user's silence after a reply has lasted ``idle_timeout_ms``; all in the session's event loop.

    Args:
        loop: the session's event loop.
        detection: the session's turn detection now (only server_vad with ``idle_timeout_ms`` arms the timer).
        fire: called with the timeout (seconds) when the silence has lasted that long.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, detection: Callable[[], TurnDetection],
                 fire: Callable[[float], None]) -> None:
        self.loop, self.detection, self.fire = loop, detection, fire
        self._handle: asyncio.TimerHandle | None = None
        self._first_audio: float | None = None  # loop time of the reply's first audio delta
        self._audio_s = 0.0

    def timeout_s(self) -> float | None:
        detection = self.detection()
        if detection.kind != "server_vad" or not detection.idle_timeout_ms:
            return None
        return detection.idle_timeout_ms / 1000

    def reply_audio(self, seconds: float) -> None:
        """A delta of ``seconds`` of the reply's audio went out."""
        if self._first_audio is None:
            self._first_audio = self.loop.time()
        self._audio_s += seconds

    def reply_finished(self, waits_for_user: bool) -> None:
        """The response is done: time the silence from the end of its audio, if the user's turn comes next."""
        played_until = max(self.loop.time(), (self._first_audio or 0.0) + self._audio_s)
        self.cancel()
        if not waits_for_user or (timeout := self.timeout_s()) is None:
            return
        self._handle = self.loop.call_at(played_until + timeout, self.fire, timeout)

    def cancel(self) -> None:
        """The user spoke, committed, or another response began: no prompt is due."""
        if self._handle is not None:
            self._handle.cancel()
        self._handle, self._first_audio, self._audio_s = None, None, 0.0

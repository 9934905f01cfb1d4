"""A WebRTC call (``POST /v1/realtime/calls``): one session's :class:`~s2s.server.links.Link` over aiortc.

The client's SDP offer gets an answer with every ICE candidate in it (no trickle: the HTTP answer is the only
signalling). Then the microphone's Opus track feeds the session (:meth:`Session.hear`, resampled there to the
pipeline's rate), the session's events go out on the ``oai-events`` data channel the client opened, and its reply
audio, instead of ``response.output_audio.delta`` events, goes out on the answer's audio track
(:class:`~s2s.server.rtc_audio.Speaker`), paced in 20 ms frames. ``output_audio_buffer.clear`` (a WebRTC-only
client event) cuts the reply's audio; so does the user speaking over it, and the assistant's item is then
truncated to what was played, as OpenAI's calls do. Needs aiortc (the ``webrtc`` extra).
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from typing import Any

import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from s2s import audio
from s2s.server.client_log import quote
from s2s.server.links import LinkClosed
from s2s.server.protocol import ProtocolError, check_keys, dumps, event
from s2s.server.rtc_audio import RTC_RATE, Speaker, frame_floats
from s2s.server.settings import ServerSettings

log = logging.getLogger("s2s.server")
EVENTS_CHANNEL = "oai-events"  # the data channel's label, as OpenAI's clients name it
GATHER_TIMEOUT_S = 10.0  # gathering the server's ICE candidates (a STUN server that does not answer) at most
CONFIG_GRACE_S = 1.0  # the microphone waits this long after the channel opens for the client's session.update
MAX_EARLY_S = 5.0  # microphone audio held meanwhile, at most (the oldest goes first)
MAX_PENDING_EVENTS = 256  # client events waiting to be handled; more closes the call (a client that floods)
HIGH_WATER_BYTES = 1 << 20  # events waiting in the data channel's buffer before the writer waits for the client


class BadOffer(ValueError):
    """The SDP offer cannot make a call; the message says why."""


class Call:
    """A session's link over WebRTC; the server answers the offer with :meth:`answer`, then holds the session.

    Args:
        call_id: named in the call's ``Location`` (``/v1/realtime/calls/<call_id>``).
        settings: the ICE servers (STUN/TURN) and how long the call may take to connect.
    """

    kind = "webrtc"

    def __init__(self, call_id: str, settings: ServerSettings) -> None:
        self.id, self.settings = call_id, settings
        servers = [RTCIceServer(**server) for server in settings.ice_servers]
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=servers or None))
        self.speaker = Speaker(self._announce)
        self.session: Any = None
        self._frames: asyncio.Queue[str | bytes | LinkClosed] = asyncio.Queue()
        self._closed: LinkClosed | None = None
        self._channel: Any = None
        self._configured = asyncio.Event()  # the client had its chance to configure the session
        self._handled = False
        self._listening = False
        self._items: set[str] = set()  # the assistant's items in the conversation (truncated at a cut)
        self._resamplers: dict[str, audio.StreamResampler] = {}  # reply audio -> 48 kHz, per response
        self._tasks: set[asyncio.Task[None]] = set()
        self.pc.on("datachannel", self._on_channel)
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)

    # ------------------------------------------------------------------ signalling
    async def answer(self, offer: str) -> str:
        """The SDP answer to ``offer``: Opus audio both ways, the events channel, every server candidate."""
        if "m=audio" not in offer:
            raise BadOffer("the offer has no audio (m=audio): a call needs the microphone's track")
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        except Exception as error:  # aiortc's parser raises what it meets: ValueError, KeyError, IndexError...
            raise BadOffer(f"the SDP offer cannot be read: {type(error).__name__}: {error}") from None
        opus = [codec for codec in RTCRtpSender.getCapabilities("audio").codecs
                if codec.mimeType.lower() == "audio/opus"]
        for transceiver in self.pc.getTransceivers():
            if transceiver.kind == "audio":
                transceiver.setCodecPreferences(opus)
        self.pc.addTrack(self.speaker)
        try:  # TimeoutError (no candidates in time) goes to the caller: it is the server's, not the offer's
            await asyncio.wait_for(self.pc.setLocalDescription(await self.pc.createAnswer()), GATHER_TIMEOUT_S)
        except (ValueError, KeyError, IndexError, AttributeError) as error:
            raise BadOffer(f"the offer cannot be answered: {type(error).__name__}: {error}") from None
        answer = self.pc.localDescription.sdp
        if "opus/48000" not in answer.lower():
            raise BadOffer("the offer has no Opus audio (opus/48000), the one codec calls use")
        self._spawn(self._watch_connect())
        return answer

    async def _watch_connect(self) -> None:
        await asyncio.sleep(self.settings.call_connect_timeout_s)
        if self.pc.connectionState != "connected":
            log.info("call %s: not connected after %g s (server.call_connect_timeout_s); releasing it", self.id,
                     self.settings.call_connect_timeout_s)
            self._close_with("never_connected")

    def _on_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self._close_with("disconnected")

    def _on_track(self, track: Any) -> None:
        if track.kind == "audio" and not self._listening:  # the microphone: one track (a second is not heard)
            self._listening = True
            self._spawn(self._listen(track))

    def _on_channel(self, channel: Any) -> None:
        if channel.label != EVENTS_CHANNEL or self._channel is not None:
            log.info("call %s: ignored a data channel %s", self.id, quote(channel.label))
            return
        self._channel = channel
        channel.on("message", self._on_message)
        channel.on("close", lambda: self._close_with("closed"))
        self._spawn(self._grace())

    async def _grace(self) -> None:
        await asyncio.sleep(CONFIG_GRACE_S)
        self._configured.set()

    def _on_message(self, message: str | bytes) -> None:
        if self._frames.qsize() >= MAX_PENDING_EVENTS:
            self._close_with("flooded")
        elif self._closed is None:
            self._frames.put_nowait(message)

    def hang_up(self, status: str = "hung_up") -> None:
        """End the call's session as if the client had gone: ``DELETE`` on the call, or the server stopping."""
        self._close_with(status)

    def _close_with(self, status: str) -> None:
        if self._closed is None:
            self._closed = LinkClosed(status)
            self._frames.put_nowait(self._closed)

    # ------------------------------------------------------------------ the link
    async def receive(self) -> str | bytes:
        if self._handled:  # the client's first event has been handled: its settings stand before any audio
            self._configured.set()
        while True:
            frame = await self._frames.get()
            if isinstance(frame, LinkClosed):
                self._frames.put_nowait(frame)
                raise frame
            self._handled = True
            if not self._transport_event(frame):
                return frame

    def _transport_event(self, frame: str | bytes) -> bool:
        """``output_audio_buffer.clear``, which only a call has (the playback buffer is here): True if it was."""
        if len(frame) > self.settings.max_frame_bytes or b"output_audio_buffer.clear" not in (
                frame.encode() if isinstance(frame, str) else frame):
            return False
        try:
            body = json.loads(frame)
        except ValueError:
            return False
        if not isinstance(body, dict) or body.get("type") != "output_audio_buffer.clear":
            return False
        try:
            check_keys(body, {"type", "event_id"}, "", body.get("event_id"))
        except ProtocolError as error:
            self.session.fail(error)
            return True
        self._cut()
        return True

    async def send(self, server_event: dict[str, Any]) -> None:
        kind = server_event["type"]
        if kind == "response.output_audio.delta":
            self._play(server_event)
            return
        if kind == "response.output_audio.done":
            self._play(server_event, end=True)
        elif kind == "input_audio_buffer.speech_started" and self.session.settings.turn_detection.interrupt_response:
            self._cut()
        elif kind == "response.done":
            self._resamplers.pop(server_event["response"]["id"], None)
            if server_event["response"]["status"] == "cancelled":
                self._cut(server_event["response"]["id"])
        elif kind == "conversation.item.added" and server_event["item"].get("role") == "assistant":
            self._items.add(server_event["item"]["id"])
        await self._deliver(server_event)

    async def _deliver(self, server_event: dict[str, Any]) -> None:
        """Onto the data channel, once it is open and has room (a client that does not read fills the outbox)."""
        while True:
            channel = self._channel
            if self._closed is not None or (channel is not None and channel.readyState in ("closing", "closed")):
                raise LinkClosed(self._closed.status if self._closed is not None else "closed")
            if channel is not None and channel.readyState == "open" and channel.bufferedAmount <= HIGH_WATER_BYTES:
                channel.send(dumps(server_event))
                return
            await asyncio.sleep(0.01)  # not open yet (the connect bound ends the wait), or the client reads slowly

    def _announce(self, kind: str, response_id: str) -> None:
        """An event of the playback buffer (started, stopped, cleared), sent at once: it follows the audio."""
        self._send_now(event(kind, response_id=response_id))

    def _send_now(self, server_event: dict[str, Any]) -> None:
        if self._channel is not None and self._channel.readyState == "open":
            self._channel.send(dumps(server_event))

    def _play(self, server_event: dict[str, Any], end: bool = False) -> None:
        response_id = server_event["response_id"]
        rate = self.session.settings.output_rate
        resampler = self._resamplers.get(response_id)
        if resampler is None or resampler.rate_in != rate:
            resampler = self._resamplers[response_id] = audio.StreamResampler(rate, RTC_RATE)
        if end:
            samples = resampler.flush()
        else:
            pcm = np.frombuffer(base64.b64decode(server_event["delta"]), dtype="<i2")
            samples = resampler.feed(audio.int16_to_float(pcm))
        self.speaker.play(response_id, server_event["item_id"], audio.float_to_int16(samples))
        if end:
            self.speaker.finish(response_id)

    def _cut(self, response_id: str | None = None) -> None:
        """Stop the reply's audio; the assistant's item keeps what was played (a truncate, as a client sends)."""
        cut = self.speaker.clear(response_id)
        if cut is None:
            return
        response_id, item_id, played = cut
        self._announce("output_audio_buffer.cleared", response_id)
        if item_id in self._items:
            self._frames.put_nowait(dumps({"type": "conversation.item.truncate", "item_id": item_id,
                                           "content_index": 0, "audio_end_ms": played * 1000 // RTC_RATE}))

    def opened(self, session: Any) -> None:
        self.session = session

    async def drop(self, error: dict[str, Any]) -> None:
        self._send_now(error)
        await self.end("overflow")

    async def end(self, status: str) -> None:
        self._close_with(status)
        self.speaker.stop()
        for task in list(self._tasks):
            task.cancel()
        await self.pc.close()

    # ------------------------------------------------------------------ the microphone
    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _listen(self, track: Any) -> None:
        """The microphone into the session; what comes before the client configured it waits (bounded).

        A call without the events channel cannot configure anything: its audio waits twice the grace, then flows.
        """
        early: list[tuple[np.ndarray, int]] = []
        full = False
        first = None
        while True:
            try:
                floats, rate = frame_floats(await track.recv())
            except MediaStreamError:
                return
            early.append((floats, rate))
            first = first if first is not None else time.monotonic()
            voice_only = self._channel is None and time.monotonic() - first > 2 * CONFIG_GRACE_S
            if self.session is None or not (self._configured.is_set() or voice_only):
                if len(early) * len(floats) > MAX_EARLY_S * rate:
                    early.pop(0)
                continue
            for block, block_rate in early:
                try:
                    await self.session.hear(block, block_rate)
                    full = False
                except ProtocolError as error:  # manual turns and no commit for minutes: said once
                    if not full:
                        self.session.fail(error)
                    full = True
            early = []

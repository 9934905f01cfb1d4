"""How a session reaches its client: a :class:`Link` per transport, so one session code serves them all.

:meth:`s2s.server.server.SessionServer.hold` runs a session over a link: client frames come from
:meth:`Link.receive`, server events go to :meth:`Link.send`. A WebSocket carries both on the socket
(:class:`WebSocketLink`); a WebRTC call (:class:`s2s.server.webrtc.Call`) carries the events on its
``oai-events`` data channel and the audio on its media tracks. The protocol is the same; only the carriage differs.
"""
from __future__ import annotations

import asyncio
from typing import Any, Protocol

from s2s.server.protocol import dumps


class LinkClosed(Exception):
    """The client's side is gone; ``status`` says how (``closed``, ``disconnected``, ``hung_up``, ...)."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


class Link(Protocol):
    """A session's transport, as the server's session loop uses it."""

    kind: str  # websocket | webrtc: named in the log

    async def receive(self) -> str | bytes:
        """The client's next event frame; raises :class:`LinkClosed` once the client is gone."""

    async def send(self, server_event: dict[str, Any]) -> None:
        """One server event to the client; raises :class:`LinkClosed` once the client is gone."""

    def opened(self, session: Any) -> None:
        """The session exists (a link that carries audio of its own feeds it from now on)."""

    async def drop(self, error: dict[str, Any]) -> None:
        """The client does not read its events: tell it with ``error`` (without waiting on it), then close."""

    async def end(self, status: str) -> None:
        """The session is over (``status``) and its last events are sent: close what is still open."""


class WebSocketLink:
    """A session over the Realtime WebSocket: events both ways as text frames, audio inside them (base64)."""

    kind = "websocket"

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def receive(self) -> str | bytes:
        from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

        try:
            return await self.connection.recv()
        except ConnectionClosedOK:
            raise LinkClosed("closed") from None
        except ConnectionClosed:
            raise LinkClosed("disconnected") from None

    async def send(self, server_event: dict[str, Any]) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await self.connection.send(dumps(server_event))
        except ConnectionClosed:
            raise LinkClosed("disconnected") from None

    def opened(self, session: Any) -> None:
        pass

    async def drop(self, error: dict[str, Any]) -> None:
        """The error is handed to the socket without waiting for the client to take it; close code 1008."""
        try:
            await asyncio.wait_for(self.connection.send(dumps(error)), 1.0)
        except Exception:  # TimeoutError (the frame stays queued on the socket), or the client already gone
            pass
        await self.connection.close(1008, "client too slow: events not read")

    async def end(self, status: str) -> None:
        if status == "idle_timeout":
            await self.connection.close(1000, "idle timeout")

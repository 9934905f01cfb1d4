"""The server's one listening socket: what reads a request body, and what hands the rest to ``websockets``.

``websockets`` answers only ``GET`` requests without a body (its HTTP parser refuses any other), and WebRTC
needs ``POST /v1/realtime/calls`` with an SDP offer as its body. So every accepted connection starts here: the
request head is read (bounded in size and time), a ``GET`` (a WebSocket upgrade, a page, a read-out) goes to
``websockets`` untouched, bytes and all, and any other method to an :data:`HttpApp` of the server's own, which
gets the whole body (bounded) and answers once; the connection closes after it. Why this and not another HTTP
server: DESIGN.md, "The server's HTTP layer and WebRTC".
"""
from __future__ import annotations

import asyncio
import http
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from s2s.server.client_log import quote

log = logging.getLogger("s2s.server")
MAX_HEAD_BYTES = 16 << 10  # a request line and headers; browsers send about 1 KiB
MAX_BODY_BYTES = 64 << 10  # an SDP offer is a few KiB; a client secret's session config is smaller
HEAD_TIMEOUT_S = 10.0  # a client has this long to send its request head and body (as websockets' open_timeout)


@dataclass(frozen=True)
class HttpRequest:
    """A request with a body, read whole. ``headers`` is ``websockets.datastructures.Headers`` (case-blind)."""

    method: str
    path: str
    query: str
    headers: Any
    body: bytes


@dataclass(frozen=True)
class HttpAnswer:
    """What the server answers to an :class:`HttpRequest`; the connection closes after it."""

    status: http.HTTPStatus
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()

    def encode(self) -> bytes:
        lines = [f"HTTP/1.1 {self.status.value} {self.status.phrase}", f"Content-Length: {len(self.body)}",
                 "Connection: close", "Cache-Control: no-store",
                 *([f"Content-Type: {self.content_type}"] if self.body else []),
                 *(f"{name}: {value}" for name, value in self.headers)]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


def json_answer(status: http.HTTPStatus, body: dict[str, Any], headers: tuple[tuple[str, str], ...] = ()
                ) -> HttpAnswer:
    return HttpAnswer(status, json.dumps(body, indent=2).encode(), "application/json", headers)


def error_answer(status: http.HTTPStatus, code: str, message: str,
                 headers: tuple[tuple[str, str], ...] = ()) -> HttpAnswer:
    """An error as OpenAI's HTTP API gives one: ``{"error": {"type", "code", "message"}}``."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return json_answer(status, {"error": {"type": kind, "code": code, "message": message}}, headers)


HttpApp = Callable[[HttpRequest], Awaitable[HttpAnswer]]


def _parse_head(head: bytes) -> tuple[str, str, str, Any]:
    """The method, path, query and headers of a request head; ValueError when it is not HTTP/1.1."""
    from websockets.datastructures import Headers

    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[1].startswith("/") or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise ValueError(f"not an HTTP/1.1 request line: {lines[0][:200]!r}")
    headers = Headers()
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise ValueError(f"not a header line: {line[:200]!r}")
        headers[name] = value.strip()
    path, _, query = parts[1].partition("?")
    return parts[0], path, query, headers


class FrontProtocol(asyncio.Protocol):
    """One accepted connection until it is known whose it is: ``websockets``' (``hand_off``) or the app's.

    Args:
        hand_off: makes the ``websockets`` connection (an asyncio protocol) that takes a ``GET`` over.
        app: answers every other request; None: they get 501 (the Ray front, which relays WebSocket sessions only).
        tasks: the set the app's running answers are kept in (the server cancels them when it stops).
    """

    def __init__(self, hand_off: Callable[[], asyncio.Protocol], app: HttpApp | None,
                 tasks: set[asyncio.Task[None]]) -> None:
        self._hand_off, self._app, self._tasks = hand_off, app, tasks
        self._buffer = bytearray()
        self._head: tuple[str, str, str, Any] | None = None
        self._length = 0
        self._transport: Any = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:  # asyncio's, or uvloop's (Ray Serve runs on uvloop)
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT_S, self._expire)

    def _expire(self) -> None:
        assert self._transport is not None and self._timer is not None
        self._timer.cancel()  # fired: connection_lost must not report it again
        log.info("opening handshake failed: no complete request within %g s", HEAD_TIMEOUT_S)
        self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None and not self._timer.cancelled():  # the client left before its request was whole
            self._timer.cancel()
            log.info("opening handshake failed: the connection closed after %d byte(s) of a request",
                     len(self._buffer))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    self._answer_now(error_answer(http.HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "head_too_large",
                                                  f"the request head is over {MAX_HEAD_BYTES} bytes"))
                return
            if self._buffer.startswith(b"GET "):
                self._to_websockets()
                return
            self._read_head(end)
            if self._head is None:
                return
        if len(self._buffer) >= self._length:
            self._start_answer()

    def _to_websockets(self) -> None:
        assert self._transport is not None and self._timer is not None
        self._timer.cancel()  # websockets keeps its own open_timeout from here
        connection = self._hand_off()
        self._transport.set_protocol(connection)
        connection.connection_made(self._transport)
        connection.data_received(bytes(self._buffer))

    def _read_head(self, end: int) -> None:
        try:
            method, path, query, headers = _parse_head(bytes(self._buffer[:end]))
        except ValueError as error:
            log.info("refused a malformed request: %s", quote(str(error)))
            self._answer_now(error_answer(http.HTTPStatus.BAD_REQUEST, "bad_request", str(error)))
            return
        if "Transfer-Encoding" in headers:
            self._answer_now(error_answer(http.HTTPStatus.LENGTH_REQUIRED, "length_required",
                                          "send the body with a Content-Length (no Transfer-Encoding)"))
            return
        try:
            length = int(headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            self._answer_now(error_answer(http.HTTPStatus.BAD_REQUEST, "bad_request", "a bad Content-Length"))
            return
        if length > MAX_BODY_BYTES:
            self._answer_now(error_answer(http.HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body_too_large",
                                          f"the body has {length} bytes; at most {MAX_BODY_BYTES}"))
            return
        del self._buffer[:end + 4]
        self._head, self._length = (method, path, query, headers), length

    def _start_answer(self) -> None:
        assert self._head is not None and self._timer is not None and self._transport is not None
        self._timer.cancel()
        self._transport.pause_reading()  # one request per connection: anything after its body is not read
        method, path, query, headers = self._head
        request = HttpRequest(method, path, query, headers, bytes(self._buffer[:self._length]))
        task = asyncio.get_running_loop().create_task(self._answer(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, request: HttpRequest) -> None:
        if self._app is None:
            answer = error_answer(http.HTTPStatus.NOT_IMPLEMENTED, "not_implemented",
                                  f"{request.method} {request.path[:200]} is not served here: this endpoint takes "
                                  f"WebSocket sessions and GET read-outs only (WebRTC calls and client secrets "
                                  f"need server.engine=local)")
        else:
            try:
                answer = await self._app(request)
            except Exception as error:  # a bug: this request fails, the server goes on
                log.exception("answering %s %s failed", request.method, quote(request.path))
                answer = error_answer(http.HTTPStatus.INTERNAL_SERVER_ERROR, "server_error",
                                      f"internal error: {type(error).__name__}")
        self._answer_now(answer)

    def _answer_now(self, answer: HttpAnswer) -> None:
        assert self._transport is not None and self._timer is not None
        self._timer.cancel()
        if not self._transport.is_closing():
            self._transport.write(answer.encode())
            self._transport.close()

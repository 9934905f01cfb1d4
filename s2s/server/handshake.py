"""What every listening socket of the server does before a session exists: HTTP read-outs, keys, origins, limits.

The local server, each Ray replica and the Ray front (``server.engine=ray``) listen through :func:`listen`, so
the rules below are stated once: which paths answer without a key, how a key is offered (a Bearer header, or
from a browser the ``openai-insecure-api-key.<key>`` subprotocol; a client secret stands for the key), which
pages may connect from a browser (:func:`refusal`, for WebSocket and WebRTC alike), the frame cap, and how a full
server refuses a session (:func:`refuse`). What ``GET /v1/sessions`` and ``GET /health`` show comes from a
:class:`ReadOuts`: one server's sessions, or every replica's. Requests with a body (WebRTC calls) reach an
:data:`~s2s.server.front.HttpApp` through the front (:mod:`s2s.server.front`).
"""
from __future__ import annotations

import asyncio
import hmac
import http
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from s2s.server import protocol
from s2s.server.client_log import quote
from s2s.server.client_secrets import ClientSecrets
from s2s.server.front import FrontProtocol, HttpApp
from s2s.server.protocol import ProtocolError, dumps
from s2s.server.settings import ServerSettings

log = logging.getLogger("s2s.server")
PATH = "/v1/realtime"
PAGE_DIR = Path(__file__).resolve().parent / "page"
PAGE_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
              ".css": "text/css; charset=utf-8"}
# Browsers cannot set headers on a WebSocket, so their clients offer the key as a subprotocol next to "realtime"
# (as OpenAI's browser clients do); the server only ever answers "realtime", so the key is not echoed back.
KEY_SUBPROTOCOL = "openai-insecure-api-key."
FRAME_HARD_CAP = 4  # frames over max_frame_bytes * this close the connection (1009) instead of an error event
LIMIT_CLOSE = 1013  # "try again later": the close code after session_limit_reached


class ReadOuts(Protocol):
    """What the HTTP read-outs show: ``GET /v1/sessions`` (every session's figures) and ``GET /health``."""

    async def sessions(self) -> dict[str, Any]: ...

    def health(self) -> tuple[http.HTTPStatus, dict[str, Any]]: ...


def json_response(status: http.HTTPStatus, body: dict[str, Any]) -> Any:
    from websockets.datastructures import Headers
    from websockets.http11 import Response

    data = json.dumps(body, indent=2).encode()
    headers = Headers([("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                       ("Connection", "close")])
    return Response(status.value, status.phrase, headers, data)


def _page_response(path: str) -> Any:
    """A file of the browser page (``/`` is its index.html), or None when ``path`` is not one of them."""
    from websockets.datastructures import Headers
    from websockets.http11 import Response

    name = "index.html" if path == "/" else path.removeprefix("/page/")
    files = {file.name: file for file in PAGE_DIR.iterdir() if file.suffix in PAGE_TYPES} if PAGE_DIR.is_dir() else {}
    if (path != "/" and not path.startswith("/page/")) or name not in files:
        return None
    data = files[name].read_bytes()
    headers = Headers([("Content-Type", PAGE_TYPES[files[name].suffix]), ("Content-Length", str(len(data))),
                       ("Cache-Control", "no-cache"), ("X-Content-Type-Options", "nosniff"),
                       ("Referrer-Policy", "no-referrer"),
                       ("Content-Security-Policy", "default-src 'self'; connect-src 'self' ws: wss:; "
                                                   "img-src 'self' data:; frame-ancestors 'none'"),
                       ("Connection", "close")])
    return Response(http.HTTPStatus.OK.value, http.HTTPStatus.OK.phrase, headers, data)


def presented_keys(headers: Any) -> list[str]:
    """The keys a client offers: a browser's ``openai-insecure-api-key.<key>`` subprotocol, a Bearer header."""
    keys = [offered.strip()[len(KEY_SUBPROTOCOL):] for value in headers.get_all("Sec-WebSocket-Protocol")
            for offered in value.split(",") if offered.strip().startswith(KEY_SUBPROTOCOL)]
    scheme, _, key = (headers.get("Authorization") or "").partition(" ")
    return keys + ([key.strip()] if scheme.lower() == "bearer" else [])


def authorized(settings: ServerSettings, keys: list[str]) -> bool:
    """No key is set, or one of ``keys`` is the server's own."""
    if not settings.api_key:
        return True
    expected = settings.api_key.encode()
    return any(hmac.compare_digest(key.encode(), expected) for key in keys)


def _select_subprotocol(connection: Any, offered: Any) -> str | None:
    """Answer "realtime" to a client that offers it (a browser fails a handshake whose offer gets no answer)."""
    return "realtime" if "realtime" in offered else None


def refusal(path: str, headers: Any, settings: ServerSettings,
            secrets: ClientSecrets | None = None) -> tuple[http.HTTPStatus, dict[str, Any]] | None:
    """Why a request to ``path`` (not a public one) is refused before anything else, or None: it may go on.

    A browser page of another site (an ``Origin`` that is not this server) is refused even without a key: it
    could otherwise reach a keyless server on localhost from any tab. Then the API key, when one is set: a Bearer
    header or, from a browser, the ``openai-insecure-api-key.<key>`` WebSocket subprotocol. Where a session
    opens (``secrets`` given), a client secret minted by ``POST /v1/realtime/client_secrets`` (``ek_...``) stands
    for it until it expires or is used; nowhere else (it mints no secrets, reads no sessions).
    """
    origin = headers.get("Origin")
    if origin and urlsplit(origin).netloc != headers.get("Host", ""):  # another site, in a user's browser
        log.info("refused a connection to %s from a page of %s", quote(path), quote(origin))
        return http.HTTPStatus.FORBIDDEN, {"error": {
            "type": "invalid_request_error", "code": "origin_not_allowed",
            "message": f"a page from {origin} may not use this server: only the server's own page (same origin) "
                       f"and clients that send no Origin header (SDKs, s2s.client) may"}}
    keys = presented_keys(headers)
    if not authorized(settings, keys) and not (secrets is not None and any(map(secrets.valid, keys))):
        log.info("refused a connection to %s: missing or wrong API key", quote(path))
        return http.HTTPStatus.UNAUTHORIZED, {"error": {
            "type": "invalid_request_error", "code": "invalid_api_key",
            "message": "missing, wrong or expired API key: send 'Authorization: Bearer <server.api_key or a client "
                       "secret>' (from a browser's WebSocket: the subprotocols 'realtime', "
                       "'openai-insecure-api-key.<key>')"}}
    return None


async def route(request: Any, settings: ServerSettings, read_outs: ReadOuts,
                secrets: ClientSecrets | None = None) -> Any:
    """The HTTP answer to a ``GET``, or None to go on with the WebSocket handshake of :data:`PATH`.

    ``/health`` and the browser page (``/``, ``/page/*``: it holds no key, it asks the user for one) answer
    without a key; every other path goes through :func:`refusal` (origin, key) first.
    """
    path = urlsplit(request.path).path.rstrip("/") or "/"
    if path == "/health":
        return json_response(*read_outs.health())
    if (page := _page_response(path)) is not None:
        return page
    if (refused := refusal(path, request.headers, settings, secrets if path == PATH else None)) is not None:
        return json_response(*refused)  # a client secret opens a session, and reads nothing else
    if path == "/v1/sessions":
        return json_response(http.HTTPStatus.OK, await read_outs.sessions())
    if path != PATH:
        return json_response(http.HTTPStatus.NOT_FOUND, {"error": {
            "type": "invalid_request_error", "code": "not_found",
            "message": f"no such endpoint {path}; the realtime endpoint is {PATH}"}})
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return json_response(http.HTTPStatus.UPGRADE_REQUIRED, {"error": {
            "type": "invalid_request_error", "code": "websocket_required",
            "message": f"{PATH} is a WebSocket endpoint"}})
    return None


async def refuse(connection: Any, message: str, code: str = "session_limit_reached") -> None:
    """A session the server cannot hold: one error event, then close code 1013 (full) or 1008 (a used key)."""
    from websockets.exceptions import ConnectionClosed

    try:
        await connection.send(dumps(protocol.error_event(ProtocolError(code, message))))
        await connection.close(*((LIMIT_CLOSE, "session limit reached") if code == "session_limit_reached"
                                 else (1008, code)))
    except ConnectionClosed:
        pass


class _ClientHandshakeFilter(logging.Filter):
    """websockets logs a handshake the client cut short or garbled at ERROR with three chained tracebacks (about
    35 lines), so any client could fill the log with them by opening sockets. Such a failure becomes one INFO
    line, its cause quoted; a failure of the server's own code in the handshake (``route``) keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        from websockets.exceptions import InvalidHandshake

        error = record.exc_info[1] if record.exc_info else None
        if record.msg == "opening handshake failed" and isinstance(error, InvalidHandshake):
            cause = f"{error}: {error.__cause__}" if error.__cause__ else str(error)
            record.msg, record.args = "opening handshake failed: %s", (quote(cause),)
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
            record.exc_info, record.exc_text = None, None
        return True


CLIENT_HANDSHAKE_FILTER = _ClientHandshakeFilter()


async def listen(handler: Callable[[Any], Awaitable[None]], settings: ServerSettings, read_outs: ReadOuts,
                 stop: asyncio.Event, on_listening: Callable[[int], None], app: HttpApp | None = None,
                 secrets: ClientSecrets | None = None) -> None:
    """Serve ``handler`` (one call per accepted WebSocket) on ``settings.host:port`` until ``stop`` is set.

    Every connection goes through the front (:mod:`s2s.server.front`): a ``GET`` goes to ``websockets``, where
    :func:`route` answers it or lets the WebSocket handshake go on; any other request to ``app`` (None: 501).
    ``secrets`` are the client secrets that stand for the API key. ``on_listening`` gets the bound port
    (``port: 0`` picks one).
    """
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.server import ServerProtocol

    logging.getLogger("websockets.server").addFilter(CLIENT_HANDSHAKE_FILTER)  # once: a logger holds a filter once
    answering: set[asyncio.Task[None]] = set()

    def front(_: Any, server: Any, **options: Any) -> FrontProtocol:
        """``serve()``'s ``create_connection``: the front first; a ``GET`` becomes a ``websockets`` connection.

        Its own sans-I/O protocol (not ``serve()``'s, whose subprotocol choice asks the connection it is made for)
        holds our subprotocol answer and frame cap; ``options`` are ``serve()``'s keepalive and queue settings.
        """
        def websocket() -> ServerConnection:
            def choose(protocol: ServerProtocol, offered: Any) -> str | None:
                return _select_subprotocol(connection, offered)

            connection = ServerConnection(ServerProtocol(select_subprotocol=choose,
                                                         max_size=settings.max_frame_bytes * FRAME_HARD_CAP),
                                          server, **options)
            return connection

        return FrontProtocol(websocket, app, answering)

    # serve()'s own hook, in websockets 13 to 17 alike (17 changed Server's constructor, and Server.wrap went)
    server = await serve(handler, settings.host, settings.port, compression=None, create_connection=front,
                         process_request=lambda connection, request: route(request, settings, read_outs, secrets))
    try:
        on_listening(server.sockets[0].getsockname()[1])
        await stop.wait()
    finally:
        for task in list(answering):
            task.cancel()
        server.close()
        await server.wait_closed()

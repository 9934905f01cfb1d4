"""``python run.py server=realtime``: the OpenAI Realtime WebSocket endpoint, HTTP read-outs, limits and keys.

``ws://HOST:PORT/v1/realtime`` speaks the Realtime protocol (the official ``openai`` SDK connects unchanged with
``OpenAI(base_url="http://HOST:PORT/v1", api_key=KEY).realtime.connect(model=...)``). ``GET /v1/sessions``
shows every session's per-turn figures as JSON; ``GET /health`` answers ``ok``; ``GET /`` is a browser page
(``s2s/server/page/``) that talks to the same endpoint from the microphone.
"""
from __future__ import annotations

import asyncio
import hmac
import http
import json
import logging
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from omegaconf import DictConfig

from s2s import sharing, tracing
from s2s.config import StageSpec, describe_graph
from s2s.config_errors import EXIT_CONFIG
from s2s.graph import StageSetupError
from s2s.server import protocol
from s2s.server.outbox import Close, Send
from s2s.server.pipelines import Pool, check_shape
from s2s.server.protocol import ProtocolError, dumps
from s2s.server.session import Session
from s2s.server.settings import ServerSettings, read_settings
from s2s.server.stages import SocketSink, SocketSource
from s2s.stage import require

log = logging.getLogger("s2s.server")
PATH = "/v1/realtime"
PAGE_DIR = Path(__file__).resolve().parent / "page"
PAGE_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
              ".css": "text/css; charset=utf-8"}
# Browsers cannot set headers on a WebSocket, so their clients offer the key as a subprotocol next to "realtime"
# (as OpenAI's browser clients do); the server only ever answers "realtime", so the key is not echoed back.
KEY_SUBPROTOCOL = "openai-insecure-api-key."
FRAME_HARD_CAP = 4  # frames over max_frame_bytes * this close the connection (1009) instead of an error event


def session_specs(specs: list[StageSpec]) -> list[StageSpec]:
    """The stages each session gets: the socket instead of the configured source and sink."""
    return [StageSpec(specs[0].group, "s2s.server.stages.SocketSource", SocketSource, {}), *specs[1:-1],
            StageSpec(specs[-1].group, "s2s.server.stages.SocketSink", SocketSink, {})]


def main(cfg: DictConfig, specs: list[StageSpec]) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit code (0 stopped, 1 could not start, 2 bad config)."""
    settings, errors = read_settings(cfg)
    errors += check_shape(specs)
    if errors:
        for error in errors:
            print(f"config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    assert settings is not None
    if cfg.dry_run:
        print(f"server: ws://{settings.host}:{settings.port}{PATH}, max_sessions={settings.max_sessions}, "
              f"api_key={'set' if settings.api_key else 'none'}; each session gets its own")
        print(describe_graph(cfg, session_specs(specs)))
        return 0
    require("websockets", backend="server=realtime", extra="server")
    sharing.enable()  # the pipelines share weights where the backend allows it (faster-whisper, transformers, onnx)
    pool = Pool(specs, settings.max_sessions)
    try:
        pool.setup(warm_up=bool(cfg.runner.warm_up))
        return asyncio.run(_serve(cfg, specs, pool, settings))
    except StageSetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:  # the port is taken, the address is not ours
        print(f"error: cannot listen on {settings.host}:{settings.port}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the loop could take signals over
        return 130
    finally:
        pool.close()


class _Registry:
    """Sessions now and recently ended, for ``GET /v1/sessions``."""

    def __init__(self) -> None:
        self.active: dict[str, Session] = {}
        self.ended: deque[dict[str, Any]] = deque(maxlen=200)
        self.count = 0
        self.refused = 0

    def document(self, settings: ServerSettings) -> dict[str, Any]:
        def safe(session: Session) -> dict[str, Any]:
            for _ in range(3):  # the graph's threads may add a turn while we read
                try:
                    return session.describe()
                except RuntimeError:
                    time.sleep(0.01)
            return {"id": session.id, "status": session.status}

        return {"max_sessions": settings.max_sessions, "active": len(self.active), "refused": self.refused,
                "sessions": [*self.ended, *(safe(s) for s in list(self.active.values()))]}


def _json_response(status: http.HTTPStatus, body: dict[str, Any]) -> Any:
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


def _subprotocol_key(headers: Any) -> str | None:
    """The key a browser offered as ``openai-insecure-api-key.<key>`` in ``Sec-WebSocket-Protocol``, if any."""
    for value in headers.get_all("Sec-WebSocket-Protocol"):
        for offered in value.split(","):
            if offered.strip().startswith(KEY_SUBPROTOCOL):
                return offered.strip()[len(KEY_SUBPROTOCOL):]
    return None


def _authorized(settings: ServerSettings, header: str | None, subprotocol_key: str | None = None) -> bool:
    if not settings.api_key:
        return True
    expected = settings.api_key.encode()
    if subprotocol_key is not None and hmac.compare_digest(subprotocol_key.encode(), expected):
        return True
    scheme, _, key = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(), expected)


def _select_subprotocol(connection: Any, offered: Any) -> str | None:
    """Answer "realtime" to a client that offers it (a browser fails a handshake whose offer gets no answer)."""
    return "realtime" if "realtime" in offered else None


def _route(request: Any, settings: ServerSettings, registry: _Registry) -> Any:
    """The HTTP answer to a request, or None to go on with the WebSocket handshake of :data:`PATH`.

    ``/health`` and the browser page (``/``, ``/page/*``: it holds no key, it asks the user for one) answer
    without a key; every other path needs the API key when one is set, as a Bearer header or, from a browser,
    as the ``openai-insecure-api-key.<key>`` WebSocket subprotocol. A browser page of another site (an
    ``Origin`` that is not this server) is refused even without a key: it could otherwise reach a
    keyless server on localhost from any tab.
    """
    path = urlsplit(request.path).path.rstrip("/") or "/"
    if path == "/health":
        return _json_response(http.HTTPStatus.OK, {"status": "ok"})
    if (page := _page_response(path)) is not None:
        return page
    origin = request.headers.get("Origin")
    if origin and urlsplit(origin).netloc != request.headers.get("Host", ""):  # another site, in a user's browser
        log.info("refused a connection to %s from a page of %s", path, origin)
        return _json_response(http.HTTPStatus.FORBIDDEN, {"error": {
            "type": "invalid_request_error", "code": "origin_not_allowed",
            "message": f"a page from {origin} may not use this server: only the server's own page (same origin) "
                       f"and clients that send no Origin header (SDKs, s2s.client) may"}})
    if not _authorized(settings, request.headers.get("Authorization"), _subprotocol_key(request.headers)):
        log.info("refused a connection to %s: missing or wrong API key", path)
        return _json_response(http.HTTPStatus.UNAUTHORIZED, {"error": {
            "type": "invalid_request_error", "code": "invalid_api_key",
            "message": "missing or wrong API key: send 'Authorization: Bearer <server.api_key>' (from a browser: "
                       "the WebSocket subprotocols 'realtime', 'openai-insecure-api-key.<server.api_key>')"}})
    if path == "/v1/sessions":
        return _json_response(http.HTTPStatus.OK, registry.document(settings))
    if path != PATH:
        return _json_response(http.HTTPStatus.NOT_FOUND, {"error": {
            "type": "invalid_request_error", "code": "not_found",
            "message": f"no such endpoint {path}; the realtime endpoint is {PATH}"}})
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return _json_response(http.HTTPStatus.UPGRADE_REQUIRED, {"error": {
            "type": "invalid_request_error", "code": "websocket_required",
            "message": f"{PATH} is a WebSocket endpoint"}})
    return None


async def _serve(cfg: DictConfig, specs: list[StageSpec], pool: Pool, settings: ServerSettings) -> int:
    """Listen until SIGINT or SIGTERM: HTTP read-outs, and one :class:`Session` per WebSocket connection.

    Each connection borrows a pipeline from ``pool`` for its whole life, or is refused with a
    ``session_limit_reached`` error and close code 1013 when all are out. A session runs a reader (this
    coroutine: one client frame at a time into :meth:`Session.handle`) and a writer task (the outbox into
    the socket). When the client goes, goes quiet for ``server.idle_timeout_s``, or the server stops, the
    writer drains, the session closes (in an executor: it joins the graph's threads) and the pipeline goes
    back to the pool, reset.

    Args:
        cfg: the composed config; each session's graph is built from it.
        specs: its validated stages.
        pool: the pipelines, already set up.
        settings: where to listen and what clients may send.

    Returns:
        0 once stopped.
    """
    from websockets.asyncio.server import serve
    from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

    registry = _Registry()
    sessions_dir = Path(cfg.output_dir) / "sessions"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    async def handler(connection: Any) -> None:
        """One client connection, from the session limit check to the pipeline's return to the pool."""
        pipeline = pool.acquire()
        if pipeline is None:
            registry.refused += 1
            log.info("refused a session: all %d are in use", settings.max_sessions)
            error = ProtocolError("session_limit_reached", f"all {settings.max_sessions} sessions of this server "
                                                           f"are in use (server.max_sessions); try again later")
            try:
                await connection.send(dumps(protocol.error_event(error)))
                await connection.close(1013, "session limit reached")
            except ConnectionClosed:
                pass
            return
        registry.count += 1
        session_id = protocol.new_id("sess")
        query = parse_qs(urlsplit(connection.request.path).query)

        async def send(server_event: dict[str, Any]) -> None:
            await connection.send(dumps(server_event))

        session = Session(session_id, cfg, specs, pipeline, settings, send,
                          sessions_dir / f"{registry.count:04d}-{session_id}", model=query.get("model", ["s2s"])[0])
        tracing.follow(cfg, session.recorder, "session", specs, {"session.id": session_id})
        registry.active[session_id] = session
        log.info("session %s: connected (pipeline %d, %d/%d in use)", session_id, pipeline.index, pool.in_use,
                 pool.size)
        writer = asyncio.create_task(_write(session))
        session.outbox.put(Send(protocol.event("session.created", session=session.session_object())))
        status = "closed"
        try:
            while True:
                try:
                    frame = await asyncio.wait_for(connection.recv(), settings.idle_timeout_s)
                except TimeoutError:
                    session.fail(ProtocolError("idle_timeout", f"no event for {settings.idle_timeout_s:g} s "
                                                               f"(server.idle_timeout_s); closing the session"))
                    status = "idle_timeout"
                    break
                await session.handle(frame)
        except ConnectionClosedOK:
            status = "closed"
        except ConnectionClosed:
            status = "disconnected"
        finally:
            session.outbox.put(Close())
            try:
                await asyncio.wait_for(writer, 5.0)
            except (TimeoutError, ConnectionClosed, asyncio.CancelledError):
                writer.cancel()
            await loop.run_in_executor(None, session.close, status)
            registry.ended.append(session.describe())  # before the pipeline is reset: its history is the session's
            pool.give_back(pipeline)
            registry.active.pop(session_id, None)
            summary = session.recorder.summary()
            log.info("session %s: %s after %d turn(s), %d response(s) completed, %d cancelled; median "
                     "voice-to-voice %s s", session_id, status, summary["turns"], session.responses_completed,
                     session.responses_cancelled, summary["median"].get("voice_to_voice_s"))
            if status == "idle_timeout":
                await connection.close(1000, "idle timeout")

    hard_cap = settings.max_frame_bytes * FRAME_HARD_CAP
    async with serve(handler, settings.host, settings.port, max_size=hard_cap,
                     process_request=lambda connection, request: _route(request, settings, registry),
                     select_subprotocol=_select_subprotocol, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"s2s realtime server listening on ws://{settings.host}:{port}{PATH} (max_sessions="
              f"{settings.max_sessions}, api key {'required' if settings.api_key else 'not required'}); "
              f"sessions' metrics at http://{settings.host}:{port}/v1/sessions; a browser page at "
              f"http://{settings.host}:{port}/", flush=True)
        await stop.wait()
        log.info("stopping: closing %d session(s)", len(registry.active))
    return 0


async def _write(session: Session) -> None:
    """The session's writer; a bug while translating one event is logged and the session goes on."""
    from websockets.exceptions import ConnectionClosed

    try:
        await session.writer()
    except ConnectionClosed:
        pass

"""``python run.py server=realtime``: the OpenAI Realtime endpoint (WebSocket, WebRTC), read-outs, limits, keys.

``ws://HOST:PORT/v1/realtime`` speaks the Realtime protocol (the official ``openai`` SDK connects unchanged with
``OpenAI(base_url="http://HOST:PORT/v1", api_key=KEY).realtime.connect(model=...)``). ``GET /v1/sessions``
shows every session's per-turn figures as JSON; ``GET /health`` answers ``ok``; ``GET /`` is a browser page
(``s2s/server/page/``) that talks to the same endpoint from the microphone. ``POST /v1/realtime/calls`` takes
a WebRTC call's SDP offer and ``POST /v1/realtime/client_secrets`` mints a key for one session
(:mod:`s2s.server.calls`). :class:`SessionServer` is one
process's sessions over one pool of pipelines: the whole server with ``server.engine=local``, one replica
with ``server.engine=ray`` (``s2s/server/ray_app.py``).
"""
from __future__ import annotations

import asyncio
import http
import importlib.util
import logging
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from omegaconf import DictConfig

from s2s import tracing
from s2s.config import StageSpec
from s2s.graph import StageSetupError
from s2s.server import protocol
from s2s.server.client_secrets import ClientSecrets
from s2s.server.handshake import PATH, authorized, listen, presented_keys, refuse
from s2s.server.calls import HttpEndpoints
from s2s.server.links import Link, LinkClosed, WebSocketLink
from s2s.server.outbox import Close, Send
from s2s.server.pipelines import Pipeline, Pool, share_cores, unshare
from s2s.server.protocol import ProtocolError, dumps
from s2s.server.session import Session
from s2s.server.settings import ServerSettings
from s2s.server.stages import SocketSink, SocketSource
from s2s.stage import require

log = logging.getLogger("s2s.server")


def session_specs(specs: list[StageSpec]) -> list[StageSpec]:
    """The stages each session gets: the socket instead of the configured source and sink."""
    return [StageSpec(specs[0].group, "s2s.server.stages.SocketSource", SocketSource, {}), *specs[1:-1],
            StageSpec(specs[-1].group, "s2s.server.stages.SocketSink", SocketSink, {})]


def serve_local(cfg: DictConfig, specs: list[StageSpec], settings: ServerSettings,
                stop_when: threading.Event | None = None, on_listening: Callable[[int], None] | None = None) -> int:
    """``server.engine=local``: one process, ``max_sessions`` pipelines; serve until SIGINT/SIGTERM.

    A program that embeds the server (:mod:`s2s.api`) runs it in a thread of its own instead: ``stop_when``
    stops it, and ``on_listening`` is told the bound port once clients can connect.

    Returns:
        The exit code: 0 stopped, 1 could not start, 130 interrupted during setup.
    """
    require("websockets", backend="server=realtime", extra="server")
    specs = share_cores(specs, settings.max_sessions)
    pool = Pool(specs, settings.max_sessions)
    try:
        pool.setup(warm_up=bool(cfg.runner.warm_up))
        server = SessionServer(cfg, specs, pool, settings, Path(cfg.output_dir) / "sessions")
        return asyncio.run(_serve(server, stop_when, on_listening))
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
        unshare()


async def _serve(server: SessionServer, stop_when: threading.Event | None,
                 on_listening: Callable[[int], None] | None) -> int:
    """Listen until SIGINT or SIGTERM (the main thread) or ``stop_when``; returns 0 once stopped."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
    settings = server.settings

    async def watch() -> None:  # a program's stop, from another thread
        while stop_when is not None and not stop_when.is_set():
            await asyncio.sleep(0.05)
        stop.set()

    def announce(port: int) -> None:
        calls = "" if importlib.util.find_spec("aiortc") is None else \
            f"; WebRTC calls at http://{settings.host}:{port}{PATH}/calls"
        print(f"s2s realtime server listening on ws://{settings.host}:{port}{PATH} (max_sessions="
              f"{settings.max_sessions}, api key {'required' if settings.api_key else 'not required'}){calls}; "
              f"sessions' metrics at http://{settings.host}:{port}/v1/sessions; a browser page at "
              f"http://{settings.host}:{port}/", flush=True)
        if on_listening is not None:
            on_listening(port)

    watcher = asyncio.create_task(watch()) if stop_when is not None else None
    try:
        await server.run(stop, announce)
    finally:
        if watcher is not None:
            watcher.cancel()
    log.info("stopping: closing %d session(s)", len(server.active))
    return 0


class SessionServer:
    """One process's sessions: a :class:`Session` per WebSocket connection or WebRTC call, each on a pipeline.

    Each connection borrows a pipeline of ``pool`` for its whole life, or is refused when all are out (a
    ``session_limit_reached`` error and close code 1013; a call: 503). :meth:`hold` runs each session over its
    :class:`~s2s.server.links.Link`, whatever the transport. It is also the
    :class:`~s2s.server.handshake.ReadOuts` of its socket: sessions now and recently ended.

    Args:
        cfg: the composed config; each session's graph is built from it.
        specs: its validated stages.
        pool: the pipelines, already set up.
        settings: where to listen and what clients may send.
        sessions_dir: each session writes ``<n>-<id>/transcript.jsonl`` and ``metrics.json`` here.
    """

    def __init__(self, cfg: DictConfig, specs: list[StageSpec], pool: Pool, settings: ServerSettings,
                 sessions_dir: Path) -> None:
        self.cfg, self.specs, self.pool, self.settings, self.sessions_dir = cfg, specs, pool, settings, sessions_dir
        self.active: dict[str, Session] = {}
        self.ended: deque[dict[str, Any]] = deque(maxlen=200)
        self.count = 0
        self.refused = 0
        self.secrets = ClientSecrets()  # minted by POST /v1/realtime/client_secrets; each opens one session

    async def run(self, stop: asyncio.Event, on_listening: Callable[[int], None]) -> None:
        """Listen on ``settings.host:port`` until ``stop`` is set; ``on_listening`` gets the bound port."""
        endpoints = HttpEndpoints(self)  # WebRTC calls and client secrets
        try:
            await listen(self.handler, self.settings, self, stop, on_listening, endpoints, self.secrets)
        finally:
            await endpoints.close()

    async def sessions(self) -> dict[str, Any]:
        def safe(session: Session) -> dict[str, Any]:
            for _ in range(3):  # the graph's threads may add a turn while we read
                try:
                    return session.describe()
                except RuntimeError:
                    time.sleep(0.01)
            return {"id": session.id, "status": session.status}

        return {"max_sessions": self.settings.max_sessions, "active": len(self.active), "refused": self.refused,
                "sessions": [*self.ended, *(safe(s) for s in list(self.active.values()))]}

    def health(self) -> tuple[http.HTTPStatus, dict[str, Any]]:
        return http.HTTPStatus.OK, {"status": "ok"}

    async def handler(self, connection: Any) -> None:
        """One WebSocket connection, from the session limit check to the pipeline's return to the pool."""
        pipeline = self.pool.acquire()
        if pipeline is None:
            self.refused += 1
            log.info("refused a session: all %d are in use", self.settings.max_sessions)
            await refuse(connection, f"all {self.settings.max_sessions} sessions of this server are in use "
                                     f"(server.max_sessions); try again later")
            return
        keys = presented_keys(connection.request.headers)
        secret = self.secrets.take(keys)
        if secret is None and not authorized(self.settings, keys):  # its client secret opened another session
            self.pool.give_back(pipeline)
            await refuse(connection, "this client secret has opened a session already", "invalid_api_key")
            return
        query = parse_qs(urlsplit(connection.request.path).query)
        await self.hold(WebSocketLink(connection), pipeline, query.get("model", ["s2s"])[0],
                        [secret.session] if secret is not None and secret.session else [])

    async def hold(self, link: Link, pipeline: Pipeline, model: str, configs: list[dict[str, Any]]) -> None:
        """A session over ``link`` on ``pipeline``, until the client goes, it idles or the server stops.

        The session runs a reader (one client frame at a time into :meth:`Session.handle`) and a writer task
        (the outbox into the link). When it ends, the writer drains, the session closes (in an executor: it joins
        the graph's threads) and the pipeline goes back to the pool, reset. ``configs`` (a client secret's
        session config, a call's ``session`` part) are the session's first updates, checked when they came.
        """
        settings, pool = self.settings, self.pool
        self.count += 1
        session_id = protocol.new_id("sess")
        session = Session(session_id, self.cfg, self.specs, pipeline, settings, link.send,
                          self.sessions_dir / f"{self.count:04d}-{session_id}", model=model)
        link.opened(session)
        tracing.follow(self.cfg, session.recorder, "session", self.specs, {"session.id": session_id})
        self.active[session_id] = session
        log.info("session %s: connected over %s (pipeline %d, %d/%d in use)", session_id, link.kind,
                 pipeline.index, pool.in_use, pool.size)
        writer = asyncio.create_task(_write(session))
        dropper = asyncio.create_task(_drop_when_overflowed(session, link, writer))
        session.outbox.put(Send(protocol.event("session.created", session=session.session_object())))
        for config in configs:
            await session.handle(dumps({"type": "session.update", "session": config}))
        status = "closed"
        try:
            while True:
                try:
                    frame = await asyncio.wait_for(link.receive(), settings.idle_timeout_s)
                except TimeoutError:
                    if time.monotonic() - session.last_input < settings.idle_timeout_s:
                        continue  # input audio came meanwhile (a WebRTC call's microphone)
                    session.fail(ProtocolError("idle_timeout", f"no event for {settings.idle_timeout_s:g} s "
                                                               f"(server.idle_timeout_s); closing the session"))
                    status = "idle_timeout"
                    break
                await session.handle(frame)
        except LinkClosed as closed:
            status = closed.status
        finally:
            status = "overflow" if session.overflow.is_set() else status
            session.outbox.put(Close())
            try:
                await asyncio.wait_for(writer, 5.0)
            except (TimeoutError, LinkClosed, asyncio.CancelledError):
                writer.cancel()
            await asyncio.get_running_loop().run_in_executor(None, session.close, status)
            self.ended.append(session.describe())  # before the pipeline is reset: its history is the session's
            pool.give_back(pipeline)
            self.active.pop(session_id, None)
            summary = session.recorder.summary()
            log.info("session %s: %s after %d turn(s), %d response(s) completed, %d cancelled; median "
                     "voice-to-voice %s s", session_id, status, summary["turns"], session.responses_completed,
                     session.responses_cancelled, summary["median"].get("voice_to_voice_s"))
            if status == "overflow":
                await dropper  # its close, bounded by the link's own timeouts
            else:
                await link.end(status)
            dropper.cancel()


async def _write(session: Session) -> None:
    """The session's writer; a bug while translating one event is logged and the session goes on."""
    try:
        await session.writer()
    except LinkClosed:
        pass


async def _drop_when_overflowed(session: Session, link: Link, writer: asyncio.Task[None]) -> None:
    """A client that does not read: once its outbox overflows, an ``error`` ends its session.

    The writer (waiting on the full link) stops; the error is handed to the link without waiting for the client
    to take it, and the link's close ends the reader's loop.
    """
    await session.overflow.wait()
    log.warning("session %s: its client has not read %d events (server.max_queued_events); dropping it",
                session.id, session.outbox.limit)
    writer.cancel()
    error = ProtocolError("client_too_slow", f"over {session.outbox.limit} events wait for this client to read "
                                             f"them (server.max_queued_events); closing the session")
    await link.drop(protocol.error_event(error))

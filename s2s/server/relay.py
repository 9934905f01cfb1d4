"""The front of ``server.engine=ray``: one endpoint, each session relayed to a replica with a free pipeline.

Clients connect to the front exactly as to a local server: the same handshake (:func:`handshake.route`: key,
Origin, page, read-outs), the same events. For each new session the front asks the live replicas in order of
free pipelines; a replica answers with ``session.created`` (the session is its, and the front relays frames both
ways until one side closes) or, when full, with ``session_limit_reached`` (the front asks the next one). When
every replica refuses, the client gets ``session_limit_reached`` and close code 1013, as from a local server.
A replica that vanishes mid-session (its process killed, its node gone) ends its sessions with an ``error``
event and close code 1011; the other replicas' sessions go on. A front that is stopped (Ray Serve replacing
it, the application shut down) ends every session it relays with an ``error`` event and close code 1012
(service restart), so clients know to connect again; a front whose process is killed outright can send nothing,
and its clients see the connection drop (1006) while Ray Serve starts another.

Replicas announce themselves by a heartbeat (:meth:`ReplicaTable.update`, every second: address, pipelines,
sessions active); one silent for :data:`STALE_S` or refusing connections is not asked again until it is
heard from. Ray Serve replaces a dead replica; the new one is asked once its first heartbeat arrives.
"""
from __future__ import annotations

import asyncio
import http
import json
import logging
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from s2s.server import protocol
from s2s.server.handshake import listen, refuse
from s2s.server.protocol import ProtocolError, dumps
from s2s.server.settings import ServerSettings

log = logging.getLogger("s2s.server")
STALE_S = 3.0  # a replica not heard from for this long is not asked for sessions
FORGET_S = 120.0  # ... and is dropped from the read-outs after this long
OPEN_TIMEOUT_S = 5.0  # connecting to a replica and reading its first event
FAILED_CLOSE = 1011  # the replica holding the session failed
RESTART_CLOSE = 1012  # the front is stopping (service restart): connect again
GOODBYE_S = 3.0  # how long a stopping front spends telling its clients


@dataclass
class ReplicaEntry:
    """One replica as the front knows it: from its heartbeats, plus the sessions the front relays to it."""

    replica: str  # Ray Serve's replica tag
    actor: str  # its Ray actor's name (namespace "serve")
    node: str
    pid: int
    host: str
    port: int
    max_sessions: int
    active: int  # sessions it reported holding
    refused: int
    seen: float = 0.0  # time.monotonic() of the last heartbeat
    relayed: int = 0  # sessions the front relays to it now
    down: bool = False  # it refused a connection or dropped one: not asked until its next heartbeat

    def view(self) -> dict[str, Any]:
        shown = asdict(self)
        shown.pop("seen")
        shown["ready"] = self.ready
        shown["address"] = f"{shown.pop('host')}:{shown.pop('port')}"
        return shown

    @property
    def ready(self) -> bool:
        return not self.down and time.monotonic() - self.seen < STALE_S

    @property
    def free(self) -> int:
        return self.max_sessions - max(self.active, self.relayed)


class ReplicaTable:
    """The replicas' heartbeats (written from Ray's thread, read from the front's event loop)."""

    def __init__(self) -> None:
        self._entries: dict[str, ReplicaEntry] = {}
        self._lock = threading.Lock()

    def update(self, info: dict[str, Any]) -> None:
        with self._lock:
            entry = self._entries.get(info["replica"])
            if entry is None:
                log.info("replica %s: ready at %s:%s (%d pipeline(s))", info["replica"], info["host"], info["port"],
                         info["max_sessions"])
                entry = self._entries[info["replica"]] = ReplicaEntry(**info)
            for key, value in info.items():
                setattr(entry, key, value)
            entry.seen, entry.down = time.monotonic(), False
            now = time.monotonic()
            for tag in [tag for tag, e in self._entries.items() if now - e.seen > FORGET_S]:
                del self._entries[tag]

    def mark_down(self, entry: ReplicaEntry, why: str) -> None:
        with self._lock:
            if not entry.down:
                log.warning("replica %s: %s; not asked for sessions until it is heard from again", entry.replica,
                            why)
            entry.down = True

    def entries(self) -> list[ReplicaEntry]:
        with self._lock:
            return list(self._entries.values())

    def candidates(self) -> list[ReplicaEntry]:
        """The ready replicas, the most free pipelines first."""
        return sorted((e for e in self.entries() if e.ready), key=lambda e: (-e.free, e.replica))


class Relay:
    """The front's sessions: :meth:`handler` relays one client connection; it is also the :class:`ReadOuts`.

    Args:
        settings: the server's settings (the client-facing host, port, key and limits).
        wanted: ``server.replicas``.
        replica_key: the key the replicas require (never the client's: a replica's port only serves the front).
    """

    def __init__(self, settings: ServerSettings, wanted: int, replica_key: str) -> None:
        self.settings, self.wanted, self.replica_key = settings, wanted, replica_key
        self.table = ReplicaTable()
        self.refused = 0
        self.failed: deque[dict[str, Any]] = deque(maxlen=200)  # sessions ended by their replica's failure
        self._clients: set[Any] = set()  # connections whose session this front relays now

    async def run(self, stop: asyncio.Event, on_listening: Callable[[int], None]) -> None:
        """Serve until ``stop``; then tell every relayed client that the front is going, before the port closes."""
        closing = asyncio.Event()

        async def goodbye() -> None:
            await stop.wait()
            await self._goodbye()
            closing.set()

        task = asyncio.create_task(goodbye())
        try:
            await listen(self.handler, self.settings, self, closing, on_listening)
        finally:
            task.cancel()

    async def _goodbye(self) -> None:
        """An ``error`` event and close code 1012 to each relayed client (at most :data:`GOODBYE_S` in all)."""
        from websockets.exceptions import ConnectionClosed

        error = ProtocolError("server_error", "this server's front is restarting; start a new session in a "
                                              "moment (the server goes on)")

        async def tell(connection: Any) -> None:
            try:
                await connection.send(dumps(protocol.error_event(error)))
                await connection.close(RESTART_CLOSE, "service restart")
            except ConnectionClosed:
                pass

        if self._clients:
            log.info("front stopping: telling %d session(s) to connect again", len(self._clients))
            await asyncio.wait([asyncio.create_task(tell(c)) for c in list(self._clients)], timeout=GOODBYE_S)

    async def handler(self, connection: Any) -> None:
        """One client: find it a replica (or refuse it), then relay until either side closes."""
        for entry in self.table.candidates():
            opened = await self._open(entry, connection.request.path)
            if opened is not None:
                break
        else:
            self.refused += 1
            ready = [e for e in self.table.entries() if e.ready]
            log.info("refused a session: %d replica(s) ready, none has a free pipeline", len(ready))
            await refuse(connection, f"all {sum(e.max_sessions for e in ready)} sessions of the {len(ready)} ready "
                                     f"replica(s) of {self.wanted} are in use (server.replicas x "
                                     f"server.max_sessions); try again later" if ready else
                                     f"none of the {self.wanted} replica(s) is ready (server.replicas: starting, "
                                     f"or replacing one that stopped); try again later")
            return
        upstream, first = opened
        session_id = json.loads(first).get("session", {}).get("id")
        entry.relayed += 1
        self._clients.add(connection)
        try:
            await connection.send(first)
            await self._relay(connection, upstream, entry, session_id)
        finally:
            self._clients.discard(connection)
            entry.relayed -= 1

    async def _open(self, entry: ReplicaEntry, path: str) -> tuple[Any, str] | None:
        """A connection to ``entry`` that it accepted, and its first event (``session.created``); None: try another."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        try:
            upstream = await connect(f"ws://{entry.host}:{entry.port}{path}", max_size=None, compression=None,
                                     additional_headers={"Authorization": f"Bearer {self.replica_key}"},
                                     open_timeout=OPEN_TIMEOUT_S)
        except (OSError, InvalidHandshake, TimeoutError) as error:
            self.table.mark_down(entry, f"cannot connect ({type(error).__name__}: {error})")
            return None
        try:
            first = await asyncio.wait_for(upstream.recv(), OPEN_TIMEOUT_S)
        except (ConnectionClosed, TimeoutError) as error:
            self.table.mark_down(entry, f"no session.created ({type(error).__name__})")
            await upstream.close()
            return None
        event = json.loads(first)
        if event.get("type") == "error" and event["error"].get("code") == "session_limit_reached":
            await upstream.close()
            return None
        return upstream, first

    async def _relay(self, connection: Any, upstream: Any, entry: ReplicaEntry, session_id: str | None) -> None:
        """Frames both ways until one side ends; the other side then ends the same way.

        A client's close reaches the replica with its code; a client that vanished is cut off at the replica too
        (its session ends ``disconnected``). A replica's close reaches the client with its code (idle timeout,
        frame too big); a replica that vanished gives the client an ``error`` event and close code 1011.
        """
        from websockets.exceptions import ConnectionClosed
        from websockets.protocol import State

        async def pump(source: Any, target: Any) -> None:
            try:
                async for message in source:
                    await target.send(message)
            except ConnectionClosed:
                pass

        to_replica, to_client = asyncio.create_task(pump(connection, upstream)), asyncio.create_task(
            pump(upstream, connection))
        await asyncio.wait([to_replica, to_client], return_when=asyncio.FIRST_COMPLETED)
        client, replica = connection.protocol, upstream.protocol
        if replica.state is not State.OPEN:  # the replica ended it: what it sent before reaches the client first
            await asyncio.wait([to_client], timeout=OPEN_TIMEOUT_S)
            if client.state is State.OPEN and replica.close_rcvd is None:  # it vanished
                await self._replica_failed(connection, entry, session_id)
            elif client.state is State.OPEN:
                await _close_as(connection, replica.close_rcvd)
        elif client.close_rcvd is None:  # the client vanished (or cannot be written to)
            upstream.transport.abort()
        else:
            await _close_as(upstream, client.close_rcvd)
        for task in (to_replica, to_client):
            task.cancel()
        await asyncio.gather(to_replica, to_client, return_exceptions=True)

    async def _replica_failed(self, connection: Any, entry: ReplicaEntry, session_id: str | None) -> None:
        """The replica holding the session dropped it: an ``error`` event, close code 1011, not asked again."""
        from websockets.exceptions import ConnectionClosed

        self.table.mark_down(entry, f"dropped session {session_id}")
        self.failed.append({"id": session_id, "replica": entry.replica, "status": "replica_failed"})
        error = ProtocolError("server_error", f"the replica holding this session ({entry.replica}) stopped; start "
                                              f"a new session (the server goes on)")
        try:
            await connection.send(dumps(protocol.error_event(error)))
            await connection.close(FAILED_CLOSE, "replica failed")
        except ConnectionClosed:
            pass

    # ------------------------------------------------------------------ read-outs
    def health(self) -> tuple[http.HTTPStatus, dict[str, Any]]:
        ready = sum(entry.ready for entry in self.table.entries())
        status = "ok" if ready >= self.wanted else "degraded" if ready else "unavailable"
        return (http.HTTPStatus.SERVICE_UNAVAILABLE if not ready else http.HTTPStatus.OK,
                {"status": status, "engine": "ray", "replicas": {"ready": ready, "wanted": self.wanted}})

    async def sessions(self) -> dict[str, Any]:
        """Every ready replica's ``GET /v1/sessions``, each session marked with its replica, in one document."""
        entries = [entry for entry in self.table.entries() if entry.ready]
        loop = asyncio.get_running_loop()
        documents = await asyncio.gather(*(loop.run_in_executor(None, self._fetch, entry) for entry in entries))
        sessions, active = [*self.failed], 0
        for entry, document in zip(entries, documents):
            sessions += [{**session, "replica": entry.replica} for session in (document or {}).get("sessions", [])]
            active += document["active"] if document else entry.relayed  # the replica's count: freed when 0
        return {"engine": "ray", "replicas_wanted": self.wanted, "max_sessions": sum(e.max_sessions for e in entries),
                "active": active, "refused": self.refused,
                "replicas": [entry.view() for entry in self.table.entries()], "sessions": sessions}

    def _fetch(self, entry: ReplicaEntry) -> dict[str, Any] | None:
        request = urllib.request.Request(f"http://{entry.host}:{entry.port}/v1/sessions",
                                         headers={"Authorization": f"Bearer {self.replica_key}"})
        try:
            with urllib.request.urlopen(request, timeout=OPEN_TIMEOUT_S) as response:
                return json.loads(response.read())
        except (OSError, ValueError) as error:
            log.warning("replica %s: no /v1/sessions (%s)", entry.replica, error)
            return None


async def _close_as(target: Any, close: Any) -> None:
    """Close ``target`` with the code and reason of the ``close`` frame the other side sent (1005: none)."""
    if close.code == 1005:  # an empty close frame: websockets sends one for code None
        await target.close(None, "")  # type: ignore[arg-type]
    else:
        await target.close(close.code, close.reason)

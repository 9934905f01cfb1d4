"""The Ray Serve application of ``server.engine=ray``: a front and ``server.replicas`` replicas.

Ray Serve places the replicas on the cluster, checks their health and replaces one that dies; it does not
route the sessions. Its request router counts requests, not sessions held for minutes, and when every replica
is busy it queues or answers 503, where a Realtime client expects ``session_limit_reached``; so each replica
listens on a port of its own and the front (:mod:`s2s.server.relay`) hands each session to one with a free
pipeline.

* :class:`Replica` receives the composed, resolved config of the driver (overrides, profiles and the platform
  rules already applied; nothing is composed again), sets up ``server.max_sessions`` pipelines and runs the
  local server's :class:`~s2s.server.server.SessionServer` on them, then tells the front where it listens,
  every second. A pipeline that cannot be set up fails the replica with its stage's error.
* :class:`Front` listens where the driver was told to (``server.host:server.port``, on the driver's node) and
  relays each session to a replica.

Both run their event loop in a thread of their own (:class:`LoopThread`): Serve calls their methods (the
heartbeat, the health check) on its own.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from s2s import tracing
from s2s.config import validate
from s2s.config_errors import ConfigErrors
from s2s.graph import StageSetupError
from s2s.platform import fix_allocator
from s2s.server.pipelines import Pool, share_cores
from s2s.server.relay import Relay
from s2s.server.server import SessionServer
from s2s.server.settings import ServerSettings
from s2s.sweep import limit_threads

log = logging.getLogger("s2s.server")
APP = "s2s"  # the Serve application's name on the cluster
HEARTBEAT_S = 1.0
LISTEN_TIMEOUT_S = 30.0
HEALTH_PERIOD_S = 2.0  # Serve asks each replica this often whether it still serves (check_health)


class ReplicaSetupError(RuntimeError):
    """A replica could not set up its pipelines; the message is the stage's error (the driver shows it)."""


class LoopThread:
    """``serve(stop, on_listening)`` on an event loop in a daemon thread: start it, see it alive, stop it.

    Args:
        name: the thread's name.
        serve: a coroutine function that listens, calls ``on_listening(port)``, and returns once ``stop`` is set.
    """

    def __init__(self, name: str, serve: Callable[[asyncio.Event, Callable[[int], None]], Awaitable[None]]) -> None:
        self._serve, self._name = serve, name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._port: int | None = None
        self._listening = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> int:
        """Start listening; returns the port (raises what the server raised, e.g. the port is taken)."""
        self._thread.start()
        if not self._listening.wait(LISTEN_TIMEOUT_S):
            raise RuntimeError(f"{self._name} did not listen within {LISTEN_TIMEOUT_S:g} s")
        if self._port is None:
            raise RuntimeError(f"{self._name} could not listen: {type(self._error).__name__}: {self._error}")
        return self._port

    def _run(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            await self._serve(self._stop, self._on_listening)

        try:
            asyncio.run(main())
        except BaseException as error:  # reported by start() or by the health check
            self._error = error
            log.exception("%s stopped", self._name)
        finally:
            self._listening.set()

    def _on_listening(self, port: int) -> None:
        self._port = port
        self._listening.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and self.alive:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)


def _log_to_stderr() -> None:
    """The project's INFO lines (sessions connected and ended) reach the driver's console, as in a local run."""
    logger = logging.getLogger("s2s")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


class Replica:
    """``server.max_sessions`` pipelines and the sessions on them, on a port of this replica's node.

    Args:
        config: the driver's composed config, resolved (``OmegaConf.to_container(cfg, resolve=True)``).
        settings: the server's settings as a replica uses them: its bind host (None: this node's address), port
            0, and the key only the front knows as its ``api_key``.
    """

    def __init__(self, config: dict[str, Any], settings: ServerSettings) -> None:
        import ray
        from omegaconf import OmegaConf
        from ray import serve

        _log_to_stderr()
        limit_threads()  # Ray gives the replica server.replica_cpus threads through OMP_NUM_THREADS
        fix_allocator()  # a replica's process loads its pipelines' models (see s2s.platform)
        cfg = OmegaConf.create(config)
        node = ray.util.get_node_ip_address()
        try:  # cheap, and what the driver validated; on another node a path may be missing
            specs = validate(cfg)
        except ConfigErrors as errors:
            raise ReplicaSetupError(f"the config does not hold on node {node}: "
                                    + "; ".join(str(e) for e in errors.errors)) from None
        host = settings.host or node
        self.settings = dataclasses.replace(settings, host=host)
        tag = serve.get_replica_context().replica_tag
        # its pipelines share what Ray reserved for it (server.replica_cpus), as a local server shares its cores
        specs = share_cores(specs, settings.max_sessions, max(1, int(settings.replica_cpus)))
        self.pool = Pool(specs, settings.max_sessions)
        try:
            self.pool.setup(warm_up=bool(cfg.runner.warm_up))
        except StageSetupError as error:
            self.pool.close()
            raise ReplicaSetupError(str(error).replace("\n", " ")) from None
        self.server = SessionServer(cfg, specs, self.pool, self.settings,
                                    Path(cfg.output_dir) / "sessions" / f"replica-{tag}")
        self.loop = LoopThread(f"s2s-replica-{tag}", self.server.run)
        try:
            port = self.loop.start()
        except RuntimeError:
            self.pool.close()
            raise
        self.info = {"replica": tag, "actor": ray.get_runtime_context().get_actor_name(), "node": node,
                     "pid": os.getpid(), "host": host, "port": port, "max_sessions": settings.max_sessions}
        self._stopping = threading.Event()
        self._front = serve.get_deployment_handle("Front", app_name=serve.get_replica_context().app_name)
        threading.Thread(target=self._heartbeat, name="s2s-heartbeat", daemon=True).start()
        log.info("replica %s: %d pipeline(s) listening on %s:%d", tag, settings.max_sessions, host, port)

    def _heartbeat(self) -> None:
        """Tell the front, every second, where this replica listens and how many sessions it holds."""
        while not self._stopping.wait(HEARTBEAT_S):
            info = {**self.info, "active": len(self.server.active), "refused": self.server.refused}
            try:
                self._front.heartbeat.remote(info).result(timeout_s=10)
            except Exception as error:  # the front restarting: the next beat tells it again
                log.warning("replica %s: heartbeat not delivered: %s: %s", self.info["replica"],
                            type(error).__name__, error)

    def check_health(self) -> None:
        """Serve's health check: a replica whose session server stopped is replaced."""
        if not self.loop.alive:
            raise RuntimeError("the replica's session server stopped")

    def __del__(self) -> None:  # Serve's graceful shutdown of the replica
        stopping = getattr(self, "_stopping", None)  # __init__ may have failed before it existed
        if stopping is not None:
            stopping.set()
            self.loop.stop()
            self.pool.close()
            tracing.shutdown()  # the sessions' last spans (tracing.follow started this process's tracing)


class Front:
    """The one endpoint the clients see; it relays each session to a replica (:class:`~s2s.server.relay.Relay`).

    Args:
        settings: the server's settings (host, port, key, limits) as the clients see them.
        replica_key: the key the replicas require.
        replicas: the replica deployment's handle: it only binds the replicas into this application (the
            sessions do not go through Serve's router; the replicas come to the front by heartbeat).
    """

    def __init__(self, settings: ServerSettings, replica_key: str, replicas: Any) -> None:
        _log_to_stderr()
        self.settings = settings
        self.front = Relay(settings, settings.replicas, replica_key)
        self.loop = LoopThread("s2s-front", self.front.run)
        self.port = self.loop.start()
        # not "listening on ws://...": the driver prints that line once every replica is ready
        log.info("front: the endpoint is %s:%d, for %d replica(s)", settings.host, self.port, settings.replicas)

    def address(self) -> tuple[str, int]:
        return self.settings.host, self.port

    def heartbeat(self, info: dict[str, Any]) -> None:
        self.front.table.update(info)

    def replicas(self) -> list[dict[str, Any]]:
        return [entry.view() for entry in self.front.table.entries()]

    def check_health(self) -> None:
        if not self.loop.alive:
            raise RuntimeError("the front stopped listening")

    def __del__(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.stop()


def fixed_port(host: str, port: int) -> int:
    """``port``, or for 0 a free port of ``host`` chosen now: a front that Serve restarts (its actor died) binds
    the same one, so clients reconnect where they were."""
    if port:
        return port
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def build_app(config: dict[str, Any], settings: ServerSettings, replica_key: str, replica_host: str | None,
              front_node: str | None) -> Any:
    """The Serve application: :class:`Front` pinned to ``front_node`` and ``settings.replicas`` :class:`Replica`.

    Args:
        config: the composed config, resolved.
        settings: the validated server settings.
        replica_key: a fresh secret; the replicas' ports accept only it.
        replica_host: where replicas bind (127.0.0.1 on a local instance); None: each node's own address.
        front_node: the driver's node address: the front listens there, where the user asked; None: the head
            node (a Serve config deployed to a cluster, e.g. KubeRay's RayService, has no driver).
    """
    from ray import serve

    common = {"health_check_period_s": HEALTH_PERIOD_S, "max_constructor_retry_count": 1,
              "graceful_shutdown_timeout_s": 10,  # no line per heartbeat: Serve's access log stays off
              "logging_config": {"enable_access_log": False, "log_level": "WARNING"}}
    replica = serve.deployment(Replica, name="Replica", **common).options(
        num_replicas=settings.replicas, health_check_timeout_s=30,
        ray_actor_options={"num_cpus": settings.replica_cpus, "num_gpus": settings.replica_gpus})
    front = serve.deployment(Front, name="Front", **common).options(
        num_replicas=1, max_ongoing_requests=1000, health_check_timeout_s=10,
        ray_actor_options={"num_cpus": 0, "resources": {f"node:{front_node or '__internal_head__'}": 0.001}})
    settings = dataclasses.replace(settings, port=fixed_port(settings.host, settings.port))
    # host None: the replica binds its node's address (ServerSettings.host is a str once the replica has it)
    replica_settings = dataclasses.replace(settings, host=replica_host, port=0, api_key=replica_key)  # type: ignore
    return front.bind(settings, replica_key, replica.bind(config, replica_settings))

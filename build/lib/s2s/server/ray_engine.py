"""``server.engine=ray``, the driver's side: join or start Ray, deploy the application, serve until stopped.

Without ``RAY_ADDRESS`` the driver starts a local Ray instance (and stops it at the end); with it, it joins that
cluster (``auto``: the one running on this machine; ``HOST:PORT``: the head's address that ``ray start --head``
prints), within :data:`CONNECT_TIMEOUT_S`. A malformed address or a cluster it cannot reach is a config error
(exit 2), before any model loads. The application (:mod:`s2s.server.ray_app`) gets the composed config
resolved, so every replica runs what this command line composed. A replica that cannot set up its pipelines
fails the start with its stage's error (exit 1).
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig, OmegaConf

from s2s.config import StageSpec
from s2s.config_errors import EXIT_CONFIG, ConfigError
from s2s.server.handshake import PATH
from s2s.server.ray_app import APP, build_app
from s2s.server.settings import ServerSettings
from s2s.stage import MissingExtraError, require

CONNECT_TIMEOUT_S = 15.0  # joining a cluster: longer than this is "cannot be reached"
PROBE_TIMEOUT_S = 5.0  # the TCP check of RAY_ADDRESS before Ray itself tries (its own retries take a minute)
START_TIMEOUT_S = 900.0  # every replica set up (models load) within this
ADDRESS = re.compile(r"(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})")
VALID_ADDRESS = ("auto (the cluster running on this machine) or HOST:PORT of the cluster's head (the address "
                 "`ray start --head` prints); unset: start a local Ray instance")


def _address() -> str | None:
    return os.environ.get("RAY_ADDRESS", "").strip() or None


def config_errors(settings: ServerSettings, specs: list[StageSpec]) -> list[ConfigError]:
    """What is wrong with ``RAY_ADDRESS`` and the replicas' resources, checked before anything loads."""
    errors = []
    address = _address()
    if address is not None and address != "auto" and not (
            (found := ADDRESS.fullmatch(address)) and 1 <= int(found.group("port")) <= 65535):
        errors.append(ConfigError("RAY_ADDRESS", address, VALID_ADDRESS))
    on_cuda = [f"{spec.group}.device={spec.kwargs['device']}" for spec in specs
               if str(spec.kwargs.get("device", "")).startswith("cuda")]
    if on_cuda and settings.replica_gpus == 0:
        errors.append(ConfigError("server.replica_gpus", 0, f"a number > 0 with {on_cuda[0]} (Ray hides the GPUs "
                                                            f"from a replica that asks for none)"))
    return errors


def describe_deployment(settings: ServerSettings) -> str:
    """The dry run's deployment lines: where Ray runs, the front, the replicas and their pipelines."""
    address = _address()
    where = f"the Ray cluster at RAY_ADDRESS={address}" if address else "a local Ray instance (RAY_ADDRESS unset)"
    return "\n".join([
        f"deployment: Ray Serve application '{APP}' on {where}",
        "  front    x1 on this node: the handshake, the API key, each session to a replica with a free pipeline",
        f"  replica  x{settings.replicas}, each {settings.replica_cpus:g} CPU, {settings.replica_gpus:g} GPU, "
        f"max_sessions={settings.max_sessions}: {settings.replicas * settings.max_sessions} sessions in all"])


def serve_on_ray(cfg: DictConfig, specs: list[StageSpec], settings: ServerSettings) -> int:
    """Serve on Ray Serve replicas until SIGINT/SIGTERM; returns 0, 1 (could not start) or 2 (no cluster)."""
    try:
        require("websockets", backend="server=realtime", extra="server")
        require("ray.serve", backend="server.engine=ray", extra="ray")
    except MissingExtraError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    address = _address()
    try:
        if problem := _connect(address, settings):
            print(f"config error: {problem}", file=sys.stderr)
            return EXIT_CONFIG
        stop = threading.Event()  # after ray.init, which sets its own SIGTERM handler
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        return _deploy_and_serve(cfg, settings, local=address is None, stop=stop)
    finally:
        _leave(local=address is None)


def _connect(address: str | None, settings: ServerSettings) -> str | None:
    """Start or join Ray, bounded in time; the config error line when the cluster cannot be reached."""
    import ray

    if address not in (None, "auto"):
        found = ADDRESS.fullmatch(address)
        assert found is not None
        host, port = found.group("host").strip("[]"), int(found.group("port"))
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
        except OSError as error:
            return str(ConfigError("RAY_ADDRESS", address, f"a Ray cluster that can be reached ({host}:{port}: "
                                                           f"{error}); {VALID_ADDRESS}"))
    if address is None:  # the replicas' logical CPUs on this machine, even beyond its cores (they say so)
        cpus = max(os.cpu_count() or 1, int(settings.replicas * settings.replica_cpus + 0.999))
        try:  # in this thread: Ray's processes die with the thread that started them (PR_SET_PDEATHSIG)
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=True,
                     logging_level="WARNING")  # "local": a new instance, never the last `ray start` one
        except Exception as error:
            return f"server.engine=ray: a local Ray instance could not start ({type(error).__name__}: {error})"
    elif (problem := _join(address)) is not None:
        return problem
    context = ray.get_runtime_context()
    joined = f"joined the Ray cluster at {address}" if address else "started a local Ray instance"
    print(f"ray: {joined} (GCS {context.gcs_address}, node {ray.util.get_node_ip_address()})", flush=True)
    return None


def _join(address: str) -> str | None:
    """``ray.init(address=...)`` within :data:`CONNECT_TIMEOUT_S` (Ray itself retries for minutes).

    Ray's own lines meanwhile (a warning per retry) are held back, and shown only if it joins: a cluster that
    cannot be reached is the one config error line.
    """
    import ray

    failure: list[BaseException] = []

    def init() -> None:
        try:
            ray.init(address=address, log_to_driver=True, logging_level="WARNING")
        except BaseException as error:
            failure.append(error)

    quiet = _Without("not the main thread")  # our own SIGTERM handler follows; Ray's warning would be noise
    logging.getLogger("ray._private.worker").addFilter(quiet)
    thread = threading.Thread(target=init, name="s2s-ray-init", daemon=True)
    with _held_stderr() as held:
        thread.start()
        thread.join(CONNECT_TIMEOUT_S)
    logging.getLogger("ray._private.worker").removeFilter(quiet)
    if thread.is_alive():  # stuck inside Ray's retries: leave without waiting for them
        expected = f"a Ray cluster that answers within {CONNECT_TIMEOUT_S:g} s; {VALID_ADDRESS}"
        print(f"config error: {ConfigError('RAY_ADDRESS', address, expected)}", file=sys.stderr, flush=True)
        os._exit(EXIT_CONFIG)
    if failure:
        why = f"{type(failure[0]).__name__}: {failure[0]}".splitlines()[0]
        return str(ConfigError("RAY_ADDRESS", address, f"a Ray cluster that answers ({why}); {VALID_ADDRESS}"))
    sys.stderr.write(held.decode(errors="replace"))
    return None


@contextmanager
def _held_stderr() -> Iterator[bytearray]:
    """File descriptor 2 (Python's and the C++ core's writes alike) goes to a buffer inside the block."""
    held = bytearray()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as buffer:
        os.dup2(buffer.fileno(), 2)
        try:
            yield held
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            buffer.seek(0)
            held += buffer.read()


class _Without(logging.Filter):
    """Drops the log records whose message contains ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def _deploy_and_serve(cfg: DictConfig, settings: ServerSettings, local: bool, stop: threading.Event) -> int:
    """Deploy the application, wait for every replica (bounded), print where it listens, serve until ``stop``."""
    import ray
    from ray import serve

    serve.start(proxy_location="Disabled")  # the front is the only ingress; Serve's HTTP proxy is not needed
    if not local and APP in serve.status().applications:
        print(f"error: a Serve application '{APP}' already runs on this cluster (another s2s server); stop it "
              f"first (Ctrl-C its driver, or `serve shutdown` on the head)", file=sys.stderr)
        return 1
    config: Any = OmegaConf.to_container(cfg, resolve=True)  # what every replica runs: composed here, once
    app = build_app(config, settings, secrets.token_urlsafe(24), "127.0.0.1" if local else None,
                    ray.util.get_node_ip_address())
    failure: list[BaseException] = []

    def deploy() -> None:
        try:
            serve.run(app, name=APP, route_prefix=None)
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=deploy, name="s2s-serve-run", daemon=True)
    thread.start()
    started, shown = time.monotonic(), None
    while thread.is_alive() and not stop.is_set() and time.monotonic() - started < START_TIMEOUT_S:
        thread.join(1.0)
        states = _replica_states(APP)
        if states and states != shown:
            print(f"ray: replicas {states}", flush=True)
            shown = states
    if stop.is_set():
        return 130
    if thread.is_alive() or failure:
        print(f"error: {_start_failure(APP, failure[0] if failure else None)}", file=sys.stderr)
        return 1
    front = serve.get_app_handle(APP)
    host, port = front.address.remote().result(timeout_s=30)
    deadline = time.monotonic() + 30  # every replica's first heartbeat, so the first client finds them all
    while sum(r["ready"] for r in front.replicas.remote().result(timeout_s=10)) < settings.replicas:
        if stop.wait(0.2) or time.monotonic() > deadline:
            break
    print(f"s2s realtime server listening on ws://{host}:{port}{PATH} (engine=ray: {settings.replicas} replica(s) x "
          f"max_sessions={settings.max_sessions}, api key {'required' if settings.api_key else 'not required'}); "
          f"sessions' metrics at http://{host}:{port}/v1/sessions; a browser page at http://{host}:{port}/",
          flush=True)
    while not stop.wait(1.0):
        pass
    return 0


def _replica_states(app: str) -> str | None:
    """``2 RUNNING, 1 STARTING``-like counts of the replica deployment, or None before it exists."""
    from ray import serve

    try:
        deployment = serve.status().applications[app].deployments["Replica"]
    except Exception:  # not created yet, or the controller is busy
        return None
    return ", ".join(f"{count} {state}" for state, count in sorted(deployment.replica_states.items())) or None


def _start_failure(app: str, error: BaseException | None) -> str:
    """One line for a deployment that did not start: a replica's stage error when there is one."""
    from ray import serve

    try:
        deployments = serve.status().applications[app].deployments
    except Exception:
        deployments = {}
    for name, deployment in deployments.items():
        found = re.findall(r"ReplicaSetupError: (.+)", deployment.message or "")
        if found:
            return f"a replica could not set up its pipelines: {found[-1].strip()}"
        if deployment.status not in ("HEALTHY", "UPDATING") and deployment.message:
            return f"the {name} deployment did not start: {deployment.message.strip().splitlines()[-1]}"
    if error is None:
        return f"the replicas were not ready within {START_TIMEOUT_S:g} s ({_replica_states(app)})"
    return f"the Serve application did not start: {type(error).__name__}: {error}".splitlines()[0]


def _leave(local: bool) -> None:
    """Delete the application; a local instance is shut down with it, a cluster is only left."""
    import ray

    if not ray.is_initialized():
        return
    try:
        from ray import serve

        if local:
            serve.shutdown()
        else:
            serve.delete(APP)
    except Exception as error:  # a controller already gone: nothing left to delete
        print(f"warning: stopping the Serve application: {type(error).__name__}: {error}", file=sys.stderr)
    ray.shutdown()

"""Which engine serves a ``server=realtime`` config: its checks, the dry run's description, then local or Ray.

Every check runs before anything loads: the ``server`` keys (:mod:`s2s.server.settings`), the pipeline's shape
(:func:`s2s.server.roles.shape_errors`) and, with ``server.engine=ray``, ``RAY_ADDRESS`` and the replicas'
GPUs (:func:`s2s.server.ray_engine.config_errors`). ``dry_run=true`` prints where the server would listen, the
deployment (replicas and pipelines each) and each session's graph.
"""
from __future__ import annotations

import sys

from omegaconf import DictConfig

from s2s.config import StageSpec, describe_graph
from s2s.config_errors import EXIT_CONFIG, ConfigError
from s2s.server import ray_engine
from s2s.server.handshake import PATH
from s2s.server.roles import shape_errors
from s2s.server.server import serve_local, session_specs
from s2s.server.settings import ServerSettings, read_settings


def checked(cfg: DictConfig, specs: list[StageSpec]) -> tuple[ServerSettings | None, list[ConfigError]]:
    """The server's settings, or None and every problem of its keys, its pipeline and (Ray) its cluster."""
    settings, errors = read_settings(cfg)
    errors += shape_errors(specs)
    if settings is not None and settings.engine == "ray":
        errors += ray_engine.config_errors(settings, specs)
    return (None, errors) if errors else (settings, [])


def main(cfg: DictConfig, specs: list[StageSpec]) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit code (0 stopped, 1 could not start, 2 bad config)."""
    settings, errors = checked(cfg, specs)
    if errors:
        for error in errors:
            print(f"config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    assert settings is not None
    if cfg.dry_run:
        print(describe(settings))
        print(describe_graph(cfg, session_specs(specs)))
        return 0
    if settings.engine == "ray":
        return ray_engine.serve_on_ray(cfg, specs, settings)
    return serve_local(cfg, specs, settings)


def describe(settings: ServerSettings) -> str:
    """The dry run's lines above the graph: the endpoint and, with ``engine=ray``, the deployment."""
    endpoint = f"server: ws://{settings.host}:{settings.port}{PATH}, "
    key = f"api_key={'set' if settings.api_key else 'none'}"
    if settings.engine == "local":
        return f"{endpoint}max_sessions={settings.max_sessions}, {key}; each session gets its own"
    return f"{endpoint}engine=ray, {key}\n{ray_engine.describe_deployment(settings)}; each session gets its own"

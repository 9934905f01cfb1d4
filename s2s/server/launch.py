"""Which engine serves a ``server=realtime`` config: its checks, the dry run's description, then local or Ray.

Every check runs before anything loads: the ``server`` keys (:mod:`s2s.server.settings`), the pipeline's shape
(:func:`s2s.server.pipelines.check_shape`). ``dry_run=true`` prints where the server would listen and each
session's graph.
"""
from __future__ import annotations

import sys

from omegaconf import DictConfig

from s2s.config import StageSpec, describe_graph
from s2s.config_errors import EXIT_CONFIG
from s2s.server.handshake import PATH
from s2s.server.pipelines import check_shape
from s2s.server.server import serve_local, session_specs
from s2s.server.settings import ServerSettings, read_settings


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
        print(describe(settings))
        print(describe_graph(cfg, session_specs(specs)))
        return 0
    return serve_local(cfg, specs, settings)


def describe(settings: ServerSettings) -> str:
    """The dry run's line above the graph: the endpoint."""
    return (f"server: ws://{settings.host}:{settings.port}{PATH}, max_sessions={settings.max_sessions}, "
            f"api_key={'set' if settings.api_key else 'none'}; each session gets its own")
